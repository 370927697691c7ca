"""A stand-in for a vLLM server, for the lifecycle self-test: answers /health with where it
runs (temp dir, session, process group) and keeps a child process alive in its group."""

import http.server
import json
import os
import subprocess
import sys
import tempfile

host = sys.argv[sys.argv.index("--host") + 1]
port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.path.join(tempfile.gettempdir(), "left-behind.sock"), "w"):
    pass  # what vLLM does with its ZMQ sockets: a file in the temp dir, never removed
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
facts = {"tmp": tempfile.gettempdir(), "sid": os.getsid(0), "pgid": os.getpgid(0), "child": child.pid,
         "bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND")}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(facts).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.HTTPServer((host, port), Handler).serve_forever()
