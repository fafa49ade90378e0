"""Test helpers: real embps-server processes on loopback port 0.

EMBPS_SERVER_BIN names the server binary and EMBPS_LIBRARY libembps.so
(ctest sets both); client/python is put on sys.path so `import embps` finds
the in-tree binding.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

SERVER_BIN = os.environ.get("EMBPS_SERVER_BIN",
                            os.path.join(ROOT, "build", "embps-server"))


class Server:
    """An embps-server process; use as a context manager."""

    def __init__(self, *args):
        self.args = list(args)
        self.proc = None
        self.port = None

    def start(self):
        fd, port_file = tempfile.mkstemp(prefix="embps-port-")
        os.close(fd)
        os.unlink(port_file)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [SERVER_BIN, "--listen", "127.0.0.1:0", "--port-file", port_file,
             "--log-level", "warn"] + self.args,
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 10
        while time.time() < deadline:
            if os.path.exists(port_file):
                with open(port_file) as f:
                    text = f.read().strip()
                if text:
                    self.port = int(text)
                    os.unlink(port_file)
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        self.stop()
        raise RuntimeError("embps-server did not start")

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def stop(self):
        """SIGTERM, then the exit status (0 for a clean shutdown)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        self.log.close()
        return rc

    def restart(self):
        self.stop()
        return self.start()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
