"""A client that is not Trainyard's: Debian's python3-grpcio with stubs generated here from
Trainyard's protos. It checks that the coordinator's protection holds for any caller, not only
for the trainyard CLI. Prints one line per check and exits 1 if any fails.

Usage: foreign_client.py ADDRESS PROTO_DIR CA_FILE WRONG_CA_FILE ADMIN_TOKEN ALICE_TOKEN BOB_TOKEN
"""
import glob
import os
import subprocess
import sys
import tempfile

import grpc


def main():
    address, proto_dir, ca_file, wrong_ca_file, admin, alice, bob = sys.argv[1:8]
    out = tempfile.mkdtemp(prefix="trainyard-stubs-")
    subprocess.check_call(
        ["protoc", f"-I{proto_dir}", f"--python_out={out}", f"--grpc_python_out={out}",
         "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
         *sorted(glob.glob(os.path.join(proto_dir, "trainyard", "v1", "*.proto")))])
    sys.path.insert(0, out)
    from trainyard.v1 import admin_service_pb2 as admin_pb
    from trainyard.v1 import admin_service_pb2_grpc as admin_grpc
    from trainyard.v1 import agent_service_pb2 as agent_pb
    from trainyard.v1 import agent_service_pb2_grpc as agent_grpc
    from trainyard.v1 import job_service_pb2 as job_pb
    from trainyard.v1 import job_service_pb2_grpc as job_grpc

    with open(ca_file, "rb") as f:
        ca = f.read()
    with open(wrong_ca_file, "rb") as f:
        wrong_ca = f.read()
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(ca))
    jobs = job_grpc.JobServiceStub(channel)
    agents = agent_grpc.AgentServiceStub(channel)
    admins = admin_grpc.AdminServiceStub(channel)
    failures = []

    def as_(token):
        return [("authorization", "Bearer " + token)] if token else []

    def expect(code, what, call):
        try:
            call()
        except grpc.RpcError as e:
            ok = e.code() == code
            print(f"{'ok' if ok else 'FAIL'}: {what}: {e.code().name} {e.details()}")
            if not ok:
                failures.append(what)
            return
        print(f"FAIL: {what}: succeeded, expected {code.name}")
        failures.append(what)

    expect(grpc.StatusCode.UNAUTHENTICATED, "ListJobs without a credential",
           lambda: jobs.ListJobs(job_pb.ListJobsRequest(), timeout=10))
    expect(grpc.StatusCode.UNAUTHENTICATED, "ListJobs with a made-up token",
           lambda: jobs.ListJobs(job_pb.ListJobsRequest(), metadata=as_("tyk_0123456789ab_x"),
                                 timeout=10))

    spec = ("name: foreign\nmodel: {builtin: mlp, args: {inputs: 4, hidden: [8], classes: 2}}\n"
            "data: {synthetic: {samples: 64, features: 4, classes: 2}}\nmax_steps: 100000000\n"
            "strategy: data_parallel\nbatch_size: 64\nworkers: {min: 64, max: 64}\n")
    job = jobs.SubmitJob(job_pb.SubmitJobRequest(spec_yaml=spec), metadata=as_(alice),
                         timeout=10)
    print(f"{'ok' if job.owner == 'alice' else 'FAIL'}: alice submitted {job.id}, owner "
          f"'{job.owner}'")
    if job.owner != "alice":
        failures.append("owner")

    expect(grpc.StatusCode.PERMISSION_DENIED, "bob reads alice's job",
           lambda: jobs.GetJob(job_pb.GetJobRequest(id=job.id), metadata=as_(bob), timeout=10))
    expect(grpc.StatusCode.PERMISSION_DENIED, "bob cancels alice's job",
           lambda: jobs.CancelJob(job_pb.CancelJobRequest(id=job.id), metadata=as_(bob),
                                  timeout=10))
    listed = jobs.ListJobs(job_pb.ListJobsRequest(), metadata=as_(bob), timeout=10)
    seen = [j.id for j in listed.jobs]
    print(f"{'ok' if job.id not in seen else 'FAIL'}: bob's listing: {seen}")
    if job.id in seen:
        failures.append("listing")
    expect(grpc.StatusCode.PERMISSION_DENIED, "bob registers a worker",
           lambda: agents.RegisterWorker(agent_pb.RegisterWorkerRequest(name="worker-0",
                                                                        slots=1000),
                                         metadata=as_(bob), timeout=10))
    expect(grpc.StatusCode.PERMISSION_DENIED, "bob reports a task status",
           lambda: agents.ReportTaskStatus(agent_pb.ReportTaskStatusRequest(worker_id="worker-0"),
                                           metadata=as_(bob), timeout=10))
    expect(grpc.StatusCode.PERMISSION_DENIED, "bob sets a rendezvous key",
           lambda: agents.RendezvousSet(agent_pb.RendezvousSetRequest(job_id=job.id, generation=1,
                                                                      key="addr", value=b"x"),
                                        metadata=as_(bob), timeout=10))
    expect(grpc.StatusCode.PERMISSION_DENIED, "bob drains worker-0",
           lambda: agents.ReportPreemption(agent_pb.ReportPreemptionRequest(worker_id="worker-0"),
                                           metadata=as_(bob), timeout=10))
    expect(grpc.StatusCode.PERMISSION_DENIED, "bob makes himself an admin token",
           lambda: admins.CreateToken(admin_pb.CreateTokenRequest(name="bob", role=1),
                                      metadata=as_(bob), timeout=10))
    expect(grpc.StatusCode.PERMISSION_DENIED, "the admin registers as an agent",
           lambda: agents.RegisterWorker(agent_pb.RegisterWorkerRequest(name="worker-0"),
                                         metadata=as_(admin), timeout=10))
    expect(grpc.StatusCode.INVALID_ARGUMENT, "a 5,000-byte cancel reason",
           lambda: jobs.CancelJob(job_pb.CancelJobRequest(id=job.id, reason="r" * 5000),
                                  metadata=as_(alice), timeout=10))
    expect(grpc.StatusCode.INVALID_ARGUMENT, "a 300-byte job id",
           lambda: jobs.GetJob(job_pb.GetJobRequest(id="j" * 300), metadata=as_(alice),
                               timeout=10))

    wrong = job_grpc.JobServiceStub(grpc.secure_channel(address,
                                                        grpc.ssl_channel_credentials(wrong_ca)))
    expect(grpc.StatusCode.UNAVAILABLE, "alice through a channel that trusts another CA",
           lambda: wrong.ListJobs(job_pb.ListJobsRequest(), metadata=as_(alice), timeout=10))
    plain = job_grpc.JobServiceStub(grpc.insecure_channel(address))
    expect(grpc.StatusCode.UNAVAILABLE, "alice in plaintext to the TLS port",
           lambda: plain.ListJobs(job_pb.ListJobsRequest(), metadata=as_(alice), timeout=10))

    cancelled = jobs.CancelJob(job_pb.CancelJobRequest(id=job.id), metadata=as_(alice),
                               timeout=10)
    ok = any("cancelled by alice" in e.reason for e in cancelled.events)
    print(f"{'ok' if ok else 'FAIL'}: alice cancels her own job; the event names her")
    if not ok:
        failures.append("cancel event")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
