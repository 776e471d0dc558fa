/* MurmurHash3_x64_128 (Austin Appleby, public domain), the function mmh3's
 * mmh3_x64_128_utupledigest computes: cluster/core/hashing.py hashes every op id with it.
 * Blocks are read little-endian whatever the host, as mmh3 does; cluster/core/fbf/hotpath.py
 * still compares this against mmh3 at import and refuses the kernel if they differ. */
#ifndef IDC_MURMUR3_H
#define IDC_MURMUR3_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint64_t idc_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t idc_load64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
#else
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24
         | (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48
         | (uint64_t)p[7] << 56;
#endif
}

static inline uint64_t idc_fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static inline void idc_murmur3_x64_128(const void *key, size_t len, uint32_t seed,
                                       uint64_t *out1, uint64_t *out2) {
    const uint8_t *data = (const uint8_t *)key;
    const size_t nblocks = len / 16;
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = seed, h2 = seed, k1, k2;
    size_t i;

    for (i = 0; i < nblocks; i++) {
        k1 = idc_load64(data + 16 * i);
        k2 = idc_load64(data + 16 * i + 8);
        k1 *= c1; k1 = idc_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = idc_rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = idc_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = idc_rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }

    const uint8_t *tail = data + nblocks * 16;
    k1 = 0;
    k2 = 0;
    switch (len & 15) {
    case 15: k2 ^= (uint64_t)tail[14] << 48; /* fall through */
    case 14: k2 ^= (uint64_t)tail[13] << 40; /* fall through */
    case 13: k2 ^= (uint64_t)tail[12] << 32; /* fall through */
    case 12: k2 ^= (uint64_t)tail[11] << 24; /* fall through */
    case 11: k2 ^= (uint64_t)tail[10] << 16; /* fall through */
    case 10: k2 ^= (uint64_t)tail[9] << 8;   /* fall through */
    case 9:
        k2 ^= (uint64_t)tail[8];
        k2 *= c2; k2 = idc_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        /* fall through */
    case 8: k1 ^= (uint64_t)tail[7] << 56; /* fall through */
    case 7: k1 ^= (uint64_t)tail[6] << 48; /* fall through */
    case 6: k1 ^= (uint64_t)tail[5] << 40; /* fall through */
    case 5: k1 ^= (uint64_t)tail[4] << 32; /* fall through */
    case 4: k1 ^= (uint64_t)tail[3] << 24; /* fall through */
    case 3: k1 ^= (uint64_t)tail[2] << 16; /* fall through */
    case 2: k1 ^= (uint64_t)tail[1] << 8;  /* fall through */
    case 1:
        k1 ^= (uint64_t)tail[0];
        k1 *= c1; k1 = idc_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
    }

    h1 ^= (uint64_t)len;
    h2 ^= (uint64_t)len;
    h1 += h2;
    h2 += h1;
    h1 = idc_fmix64(h1);
    h2 = idc_fmix64(h2);
    h1 += h2;
    h2 += h1;
    *out1 = h1;
    *out2 = h2;
}

#endif
