"""Durable submissions from a client that is not Trainyard's: Debian's python3-grpcio with stubs
generated here from Trainyard's protos, THREADS threads each with a channel of its own (as
separate programs would have), submitting JOBS small jobs to a fresh coordinator as fast as they
are acknowledged; then the coordinator's idle CPU with all of them queued, over 30 s. The same
spec as bench/coordinator_load.py's submit phase (whose client is Trainyard's own C++), so the two
can be compared.

    /usr/bin/python3 bench/submit_python.py BUILD_DIR [JOBS] [THREADS]

Prints the submissions per second (all, and the last window of 1,000), the client's own CPU
(which bounds the rate on a small machine), and the idle coordinator's share of a core.
"""
import glob
import os
import subprocess
import sys
import tempfile
import threading
import time

from coordinator_load import Coordinator, cpu_seconds

SPEC = """name: sweep
model: {builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}
data: {synthetic: {samples: 64, features: 4, classes: 2}}
epochs: 1
"""


def stubs(root):
    out = tempfile.mkdtemp(prefix="trainyard-stubs-")
    proto_dir = os.path.join(root, "proto")
    subprocess.check_call(
        ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
         "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
         *sorted(glob.glob(os.path.join(proto_dir, "trainyard", "v1", "*.proto")))])
    sys.path.insert(0, out)


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 10000
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    stubs(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import grpc
    from trainyard.v1 import job_service_pb2 as job_pb
    from trainyard.v1 import job_service_pb2_grpc as job_grpc

    print(f"## Durable submissions from python3-grpcio {grpc.__version__}, {threads} threads, "
          f"no workers, queue growing to {jobs}")
    with Coordinator(build) as c:
        with open(c.token_flag.split("=", 1)[1]) as f:
            metadata = [("authorization", "Bearer " + f.read().strip())]
        request = job_pb.SubmitJobRequest(spec_yaml=SPEC)
        acked = []
        failed = []
        lock = threading.Lock()
        counter = iter(range(jobs))

        def client():
            stub = job_grpc.JobServiceStub(grpc.insecure_channel(c.address))
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                try:
                    stub.SubmitJob(request, metadata=metadata, timeout=60)
                except grpc.RpcError as e:
                    with lock:
                        failed.append(e.details())
                    continue
                now = time.perf_counter()
                with lock:
                    acked.append(now)

        own_before = time.process_time()
        start = time.perf_counter()
        workers = [threading.Thread(target=client) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        own = time.process_time() - own_before
        last = acked[-1] - acked[-1001] if len(acked) > 1000 else elapsed
        print(f"{len(acked)} acknowledged in {elapsed:.2f} s: {len(acked) / elapsed:.0f}/s; the "
              f"last 1,000: {1000 / last:.0f}/s; {len(failed)} failed; the client used "
              f"{own / elapsed * 100:.0f} % of a core")
        if failed:
            print("first failure:", failed[0])
        time.sleep(2)
        before = cpu_seconds(c.proc.pid)
        time.sleep(30)
        idle = (cpu_seconds(c.proc.pid) - before) / 30
        print(f"idle with {jobs} queued: {idle * 100:.2f} % of a core")


if __name__ == "__main__":
    main()
