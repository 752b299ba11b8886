"""Lambda footprint of each function's bootstrap, measured on this machine.

For every function: the binary's size; cold init (spawn -> first GET .../invocation/next
on a fake Lambda runtime API served here on 127.0.0.1); the first invocation (event handed
out -> response posted); peak RSS (VmHWM of /proc/PID/status once the response is in and
the runtime asks for the next event). Each cold start is a new process; the repeats give
median and max. The functions run against the local AWS emulator (AWS_ENDPOINT_URL) with a
stack that `emulator_stack` provisioned and seeded, and deliver to a loopback receiver.

Run it through scripts/lambda-footprint, which builds, starts the emulator and sets the
environment. Only the standard library is used.
"""

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid

FUNCTIONS = ["api", "fanout", "sender", "sweeper", "health"]
FIXTURES = {
    "api": "functions/api/fixtures/http-api-health.json",
    "fanout": "functions/fanout/fixtures/events-stream.json",
    "sender": "functions/sender/fixtures/sqs-batch.json",
    "sweeper": "functions/sweeper/fixtures/scheduled-event.json",
    "health": "functions/health/fixtures/scheduled-event.json",
}
TARGETS = {"bytes": 10 * 1000 * 1000, "init_ms": 30.0, "peak_rss_kb": 40 * 1000}
RUNTIME_PREFIX = "/2018-06-01/runtime"


class Receiver(http.server.ThreadingHTTPServer):
    """The webhook endpoint: answers every POST with 204 and counts them."""

    daemon_threads = True

    def __init__(self):
        self.posts = 0
        self.lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with server.lock:
                    server.posts += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


class FakeRuntime(http.server.ThreadingHTTPServer):
    """The Lambda runtime API for one cold start: one event, then the runtime waits."""

    daemon_threads = True

    def __init__(self, event: bytes, function_arn: str):
        self.event = event
        self.request_id = str(uuid.uuid4())
        self.first_next = None
        self.pid = None
        self.init_cpu_ms = None
        self.outcome = None
        self.outcome_at = None
        self.outcome_body = b""
        self.asked_again = threading.Event()
        self.answered = threading.Event()
        self.got_first = threading.Event()
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                if self.path != f"{RUNTIME_PREFIX}/invocation/next":
                    self.send_error(404)
                    return
                if server.first_next is None:
                    server.first_next = time.monotonic()
                    if server.pid is not None:
                        server.init_cpu_ms = cpu_ms(server.pid)
                    server.got_first.set()
                    deadline_ms = int(time.time() * 1000) + 30_000
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(server.event)))
                    self.send_header("lambda-runtime-aws-request-id", server.request_id)
                    self.send_header("lambda-runtime-deadline-ms", str(deadline_ms))
                    self.send_header("lambda-runtime-invoked-function-arn", function_arn)
                    self.send_header("lambda-runtime-trace-id", "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1")
                    self.end_headers()
                    self.wfile.write(server.event)
                    return
                # The next event never comes: the measurement ends here.
                server.asked_again.set()
                server.release.wait(30)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path.endswith("/response"):
                    kind = "response"
                elif self.path.endswith("/error"):
                    kind = "error"
                else:
                    kind = "other"
                if server.outcome is None:
                    server.outcome, server.outcome_at, server.outcome_body = kind, time.monotonic(), body
                    server.answered.set()
                self.send_response(202)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def serve(server):
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server


def event_for(function: str, root: str, run: int, messages: list) -> bytes:
    with open(os.path.join(root, FIXTURES[function]), encoding="utf-8") as f:
        text = f.read()
    if function == "sender":
        batch = json.loads(text)
        record = batch["Records"][0]
        record["body"] = messages[run]
        record["messageId"] = str(uuid.uuid4())
        batch["Records"] = [record]
        return json.dumps(batch).encode()
    if function == "fanout":
        # A new outbox event each run, so every cold start fans one out for real.
        return text.replace("evt_outbox_1", f"evt_outbox_run{run}").encode()
    return text.encode()


def check_outcome(function: str, runtime: FakeRuntime):
    body = runtime.outcome_body.decode(errors="replace")
    if runtime.outcome != "response":
        raise SystemExit(f"{function}: the invocation ended with {runtime.outcome}: {body}")
    answer = json.loads(body) if body else None
    if function == "api" and answer.get("statusCode") != 200:
        raise SystemExit(f"api: GET /health answered {answer}")
    if function in ("sender", "fanout") and answer.get("batchItemFailures"):
        raise SystemExit(f"{function}: items failed: {answer}")


def cpu_ms(pid: int) -> float:
    """Time the process has spent on a CPU so far, all threads (schedstat, nanoseconds):
    unlike wall time, hardly moved by other load on the machine."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="utf-8") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:
            pass
    return total / 1e6


def memory_kb(pid: int) -> dict:
    found = {}
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                found[key] = int(value.split()[0])
    return found


def cold_start(function, binary, env, event, log):
    runtime = serve(FakeRuntime(event, f"arn:aws:lambda:us-east-1:123456789012:function:hooklane-{function}"))
    env = dict(env, AWS_LAMBDA_RUNTIME_API=f"127.0.0.1:{runtime.server_address[1]}")
    spawned = time.monotonic()
    process = subprocess.Popen([binary], env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    runtime.pid = process.pid
    try:
        if not runtime.got_first.wait(15):
            raise SystemExit(f"{function}: no request to the runtime API within 15 s (exit {process.poll()}); see the log")
        if not runtime.answered.wait(30):
            raise SystemExit(f"{function}: no response within 30 s; see the log")
        if not runtime.asked_again.wait(10):
            raise SystemExit(f"{function}: did not ask for the next event; see the log")
        memory = memory_kb(process.pid)
        check_outcome(function, runtime)
        return {
            "init_ms": (runtime.first_next - spawned) * 1000,
            "init_cpu_ms": runtime.init_cpu_ms,
            "invoke_ms": (runtime.outcome_at - runtime.first_next) * 1000,
            "peak_rss_kb": memory["VmHWM"],
        }
    finally:
        process.kill()
        process.wait()
        runtime.release.set()
        runtime.shutdown()
        runtime.server_close()


def summary(values):
    return {
        "min": round(min(values), 2),
        "median": round(statistics.median(values), 2),
        "max": round(max(values), 2),
        "runs": [round(v, 2) for v in values],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--stack-tool", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--log", required=True)
    parser.add_argument("--functions", default=",".join(FUNCTIONS))
    args = parser.parse_args()
    functions = [f for f in args.functions.split(",") if f]

    receiver = serve(Receiver())
    receiver_url = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
    prefix = f"fp{uuid.uuid4().hex[:10]}"
    seeded = subprocess.run([args.stack_tool, prefix, receiver_url, str(args.runs)], check=True, capture_output=True, text=True)
    stack = json.loads(seeded.stdout.strip().splitlines()[-1])

    env = dict(os.environ)
    env.update(stack["env"])
    env.update({
        "HOOKLANE_ALLOW_CIDRS": "127.0.0.0/8",
        "RUST_LOG": "info",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/footprint",
        "AWS_LAMBDA_LOG_STREAM_NAME": "footprint",
        "AWS_LAMBDA_INITIALIZATION_TYPE": "on-demand",
    })

    results = []
    with open(args.log, "ab") as log:
        for function in functions:
            binary = os.path.join(args.bin_dir, f"hooklane-{function}")
            runs = []
            posts_before = receiver.posts
            for run in range(args.runs):
                log.write(f"\n=== {function} run {run}\n".encode())
                log.flush()
                fn_env = dict(env, AWS_LAMBDA_FUNCTION_NAME=f"hooklane-{function}")
                runs.append(cold_start(function, binary, fn_env, event_for(function, args.root, run, stack["messages"]), log))
            if function == "sender" and receiver.posts - posts_before != args.runs:
                raise SystemExit(f"sender: {receiver.posts - posts_before} webhooks arrived for {args.runs} invocations")
            results.append({
                "function": function,
                "bytes": os.path.getsize(binary),
                "init_ms": summary([r["init_ms"] for r in runs]),
                "init_cpu_ms": summary([r["init_cpu_ms"] for r in runs if r["init_cpu_ms"] is not None]),
                "invoke_ms": summary([r["invoke_ms"] for r in runs]),
                "peak_rss_kb": summary([r["peak_rss_kb"] for r in runs]),
            })

    header = (f"{'function':<9} {'size MB':>8} {'init ms min':>11} {'init ms med':>11} {'init ms max':>11} {'init CPU ms med':>15} "
              f"{'invoke ms med':>13} {'peak RSS MB med':>15} {'peak RSS MB max':>15}")
    print(header)
    print("-" * len(header))
    for r in results:
        print(f"{r['function']:<9} {r['bytes'] / 1e6:>8.2f} {r['init_ms']['min']:>11.1f} {r['init_ms']['median']:>11.1f} {r['init_ms']['max']:>11.1f} {r['init_cpu_ms']['median']:>15.1f} "
              f"{r['invoke_ms']['median']:>13.1f} {r['peak_rss_kb']['median'] / 1000:>15.1f} {r['peak_rss_kb']['max'] / 1000:>15.1f}")
    print(f"MB = 10^6 bytes; targets: size < {TARGETS['bytes'] / 1e6:.0f} MB, cold init < {TARGETS['init_ms']:.0f} ms, peak RSS < {TARGETS['peak_rss_kb'] / 1000:.0f} MB; {args.runs} cold starts each")
    for r in results:
        r["within_targets"] = {
            "bytes": r["bytes"] < TARGETS["bytes"],
            "init_ms": r["init_ms"]["max"] < TARGETS["init_ms"],
            "peak_rss_kb": r["peak_rss_kb"]["max"] < TARGETS["peak_rss_kb"],
        }
        print(json.dumps(r))


if __name__ == "__main__":
    sys.exit(main())
