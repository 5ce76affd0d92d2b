"""What the tests of the compute nodes' programs against moto share (power_test, clustermgtd_test):
a test's temporary folder, AWS test credentials, moto's mock of AWS, and Slurm's commands faked on
PATH (scontrol recording its calls, one a line; sinfo printing what a test sets)."""

import os
import sys
import tempfile
from unittest import mock

# The node programs (NODE_DIR) import as modules; without boto3 and moto a test using this skips (77).
NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "cloudformation", "node")
sys.path.insert(0, NODE_DIR)
try:
    import boto3  # noqa: F401
    import moto  # noqa: F401
except ImportError as e:  # pragma: no cover - CTest reports the skip
    print(f"SKIPPED: {e} (boto3 and moto are needed)")
    sys.exit(77)

REGION = "us-east-1"


def moto_and_fake_slurm(test, commands):
    """For a TestCase's setUp: test.tmp (a temporary folder, removed after the test), AWS test
    credentials for REGION, moto's mock of AWS for the test, and each program `commands(test)`
    names ({name: shell body}, made once test.tmp and test.calls exist) in test.tmp/bin, first on
    PATH. test.calls is the file a fake scontrol (body scontrol_recorder(test)) appends to."""
    from moto import mock_aws

    test.tmp = tempfile.TemporaryDirectory()
    test.addCleanup(test.tmp.cleanup)
    test.calls = os.path.join(test.tmp.name, "scontrol.calls")
    test.enterContext(mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                                   "AWS_DEFAULT_REGION": REGION}))
    test.enterContext(mock_aws())
    bindir = os.path.join(test.tmp.name, "bin")
    os.mkdir(bindir)
    for name, body in commands(test).items():
        with open(os.path.join(bindir, name), "w", encoding="utf-8") as f:
            f.write(f"#!/bin/sh\n{body}\n")
        os.chmod(os.path.join(bindir, name), 0o755)
    test.enterContext(mock.patch.dict(os.environ, {"PATH": bindir + os.pathsep + os.environ["PATH"]}))


def run_instances_giving_the_templates_profile(real):
    """moto's InstanceBackend.run_instances (`real`) made to give an instance launched through a
    launch template the template's instance profile (unless the request names one), as EC2 gives
    it. moto 5.2 takes only a request's own IamInstanceProfile, and then for the first instance of a
    launch only."""
    def run_instances(backend, *args, **kwargs):
        reservation = real(backend, *args, **kwargs)
        named = kwargs.get("iam_instance_profile_arn") or kwargs.get("iam_instance_profile_name")
        if kwargs.get("launch_template") and not named:
            profile = backend._get_template_from_args(kwargs["launch_template"]).data.get("IamInstanceProfile") or {}
            if profile:
                for inst in reservation.instances:
                    backend.associate_iam_instance_profile(inst.id, iam_instance_profile_name=profile.get("Name"),
                                                           iam_instance_profile_arn=profile.get("Arn"))
        return reservation
    return run_instances


def moto_gives_instances_the_templates_profile(test):
    """For a TestCase's setUp: run_instances_giving_the_templates_profile, for the test."""
    from moto.ec2.models.instances import InstanceBackend

    test.enterContext(mock.patch.object(InstanceBackend, "run_instances",
                                        run_instances_giving_the_templates_profile(InstanceBackend.run_instances)))


def iam_refuses_terminating_without(ec2, profile):
    """A hook before(operation, params) on EC2 calls that plays what IAM does with the head node's
    TerminateOnlyTheClusterComputeInstances (its ec2:InstanceProfile condition), which moto does
    not evaluate: TerminateInstances refused whole (UnauthorizedOperation) when one of its
    instances, as `ec2` (a client without the hook) describes them, lacks `profile`."""
    from botocore.exceptions import ClientError

    def before(operation, params):
        if operation != "TerminateInstances":
            return
        for r in ec2.describe_instances(InstanceIds=params["InstanceIds"])["Reservations"]:
            if any(i.get("IamInstanceProfile", {}).get("Arn") != profile for i in r["Instances"]):
                raise ClientError({"Error": {"Code": "UnauthorizedOperation",
                                             "Message": "You are not authorized to perform this operation."}}, operation)
    return before


def scontrol_recorder(test):
    """A fake scontrol's body: its arguments appended to test.calls, one call a line."""
    return f'echo "$*" >> {test.calls}'


def recorded_calls(test):
    """The fake scontrol's calls so far, one string each."""
    if not os.path.exists(test.calls):
        return []
    with open(test.calls, encoding="utf-8") as f:
        return f.read().splitlines()


def silent_endpoint(test, answers=None):
    """For a TestCase: a local TCP server that accepts every connection and never answers (an AWS
    endpoint stalled), closed after the test; returns its URL. `answers` ({query API action: XML
    body}) are the actions it does answer (200), each request read whole first."""
    import re
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    held = []

    def serve(conn):
        data = b""
        try:
            while True:
                head, sep, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length:\s*(\d+)", head)
                if sep and len(body) >= (int(length.group(1)) if length else 0):
                    action = re.search(rb"Action=(\w+)", body)
                    reply = (answers or {}).get(action.group(1).decode() if action else "")
                    if reply is None:
                        return  # held open, never answered
                    out = reply.encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: "
                                 + str(len(out)).encode() + b"\r\n\r\n" + out)
                    data = body[int(length.group(1)) if length else 0:]
                    continue
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
        except OSError:  # closed at the test's end
            return

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            held.append(conn)  # kept open until the test ends
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()

    def close():
        server.close()
        for conn in held:
            conn.close()
    test.addCleanup(close)
    return f"http://127.0.0.1:{server.getsockname()[1]}"


# Runs a node program (argv: its path, then its own arguments) as Slurm or systemd would, with the
# AWS timeouts of hpc_cloud.aws_client shortened (connect 1 s, each read 1 s, each call's deadline
# SHORT_DEADLINE s), so that a test of a stalled endpoint takes seconds. Its bound is then
# short_worst_case(), far below botocore's own 60 s read timeout, which a client without
# aws_client's bounds waits for each try: a subprocess timeout of that bound fails such a client.
SHORT_DEADLINE = 2
SHORT_TIMEOUTS_DRIVER = f"""
import runpy, sys
sys.path.insert(0, {NODE_DIR!r})
import hpc_cloud
hpc_cloud.AWS_CONNECT_TIMEOUT = hpc_cloud.AWS_READ_TIMEOUT = 1
real = hpc_cloud.aws_client
hpc_cloud.aws_client = lambda service, region, deadline, *a, **kw: real(service, region, min(deadline, {SHORT_DEADLINE}), *a, **kw)
program = sys.argv.pop(1)
sys.argv[0] = program
runpy.run_path(program, run_name="__main__")
"""


def short_worst_case():
    """hpc_cloud.aws_worst_case(SHORT_DEADLINE) with SHORT_TIMEOUTS_DRIVER's timeouts."""
    import hpc_cloud
    return SHORT_DEADLINE + 1 + 1 + hpc_cloud.AWS_MAX_PAUSE


def run_with_short_timeouts(test, program, *args, env=None):
    """Runs `program` (a file in NODE_DIR) with SHORT_TIMEOUTS_DRIVER; its CompletedProcess. The
    test fails if it runs past short_worst_case() (it is killed then)."""
    import subprocess

    bound = short_worst_case()
    try:
        return subprocess.run([sys.executable, "-c", SHORT_TIMEOUTS_DRIVER, os.path.join(NODE_DIR, program), *args],
                              capture_output=True, text=True, env=env, timeout=bound)
    except subprocess.TimeoutExpired as e:
        test.fail(f"{' '.join((program, *args))} still waiting for a silent endpoint after {bound:g} s, its bound; "
                  f"its output: {(e.stderr or b'').decode(errors='replace')!r}")
