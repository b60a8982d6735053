import sys

from service.cli import serve_main

sys.exit(serve_main())
