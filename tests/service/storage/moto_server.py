"""moto in server mode on 127.0.0.1: a real S3-compatible endpoint for the tests of the
service on object storage (tests/service/storage/test_s3.py) and of ``chunked-tensor-ops run``
on ``s3://`` (tests/service/cli/test_run_s3.py), and an s3fs client of the tests' own to look
into its buckets."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time

import s3fs

from tests.service.processes import free_port

KEY, SECRET = "test-key-id", "test-secret-value-0123456789"


def start_moto() -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process, endpoint
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto_server did not start on port {port}")
            time.sleep(0.05)


def stop_moto(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def raw_fs(endpoint: str) -> s3fs.S3FileSystem:
    """A client of our own, to look into the bucket behind the service's back."""
    return s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": endpoint},
                             use_listings_cache=False, skip_instance_cache=True)


@contextlib.contextmanager
def moto_bucket(bucket: str):
    """moto_server on 127.0.0.1 with one bucket: its endpoint URL; stopped afterwards."""
    process, url = start_moto()
    try:
        raw_fs(url).mkdir(bucket)
        yield url
    finally:
        stop_moto(process)
