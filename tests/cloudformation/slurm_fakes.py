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
