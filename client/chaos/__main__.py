import sys

from client.chaos.cli import main

sys.exit(main())
