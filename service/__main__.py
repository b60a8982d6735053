"""``python -m service``: ``chunked-tensor-ops serve`` with the same flags, or, as ``python -m
service run ...``, ``chunked-tensor-ops run``."""

import sys

from service.cli.main import serve_main

sys.exit(serve_main())
