import sys

from client.hostile.cli import main

sys.exit(main())
