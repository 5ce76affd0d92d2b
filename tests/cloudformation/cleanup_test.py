"""The cleanup custom resource's handler (cluster.yaml: CleanupFunction's inline code), run
directly against moto's EC2 (moto's CloudFormation runs Lambda code only in a container; the
whole-stack deployment in template_test.py runs it in-process on creation): on the stack's
deletion it terminates every instance tagged for this cluster with the compute instance profile,
and only those (another cluster's in the same account survives, so do an untagged one and one
tagged for the cluster by someone else, without the profile), and answers SUCCESS; on
creation it does nothing; when it cannot finish, it answers FAILED with the reason, so that the
stack's deletion stops instead of leaving instances running. An instance shutting down is not
gone: until it is terminated its network interface holds the subnet and security group that the
stack deletes next."""

import copy
import os
import sys
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import boto3
    from moto import mock_aws
    from moto.ec2.models import ec2_backends
except ImportError as e:  # pragma: no cover - CTest reports the skip
    print(f"SKIPPED: {e} (boto3 and moto are needed)")
    sys.exit(77)

import cfn  # noqa: E402

GONE = 'GONE = ("terminated",)'  # the handler's instance states that count as gone


class Cleanup(unittest.TestCase):
    def setUp(self):
        self.enterContext(mock.patch.dict(os.environ, {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                                       "AWS_DEFAULT_REGION": cfn.REGION}))
        self.enterContext(mock_aws())
        self.ec2 = boto3.client("ec2", region_name=cfn.REGION)
        self.ami = cfn.amazon_images(self.ec2)[0]
        self.sent = []
        self.handler = cfn.cleanup_module(cfn.load_template(), self.sent).handler
        self.pauses = self.enterContext(mock.patch("time.sleep"))  # its 10 s between rounds
        # The resource's properties as the template gives them, and its compute profile in moto.
        self.properties = cfn.Resolved(cfn.load_template()).resource("InstanceCleanup")["Properties"]
        iam = boto3.client("iam", region_name=cfn.REGION)
        self.profile, self.head_profile = (iam.create_instance_profile(InstanceProfileName=n)["InstanceProfile"]["Arn"]
                                           for n in (self.properties["InstanceProfile"].split("/")[-1], "hpc-head"))
        self.assertEqual(self.profile, self.properties["InstanceProfile"])

    def launch(self, count, profile="compute", **tags):
        """`count` instances with these tags (hpctrain_node: hpctrain:node) and the compute instance
        profile (or another, or None). (moto gives a launch's profile to its first instance only.)"""
        spec = [{"ResourceType": "instance", "Tags": [{"Key": k.replace("_", ":"), "Value": v} for k, v in tags.items()]}]
        profile = {"compute": self.profile, "head": self.head_profile}.get(profile, profile)
        return {self.ec2.run_instances(ImageId=self.ami, MinCount=1, MaxCount=1,
                                       **({"TagSpecifications": spec} if tags else {}),
                                       **({"IamInstanceProfile": {"Arn": profile}} if profile else {}))["Instances"][0]["InstanceId"]
                for _ in range(count)}

    def live(self):
        found = set()
        for r in self.ec2.describe_instances()["Reservations"]:
            found |= {i["InstanceId"] for i in r["Instances"] if i["State"]["Name"] != "terminated"}
        return found

    def event(self, kind):
        return {"RequestType": kind, "ResourceProperties": {"ServiceToken": "arn", **self.properties},
                "StackId": "arn:aws:cloudformation:us-east-1:123456789012:stack/hpc/1", "LogicalResourceId": "InstanceCleanup",
                "RequestId": "r1", "ResponseURL": "https://example.invalid"}

    def test_deletion_terminates_this_cluster_only(self):
        ours = self.launch(3, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-1")
        stopped = self.launch(1, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-4")
        self.ec2.stop_instances(InstanceIds=list(stopped))  # a stopped one bills its volumes
        theirs = self.launch(2, hpctrain_cluster="other", hpctrain_node="gpu-1")
        untagged = self.launch(1)
        # Tagged for the cluster by someone else: no profile, or not the compute instances'. The
        # role may not terminate them, and EC2 would refuse the whole call (moto evaluates no IAM).
        foreign = self.launch(1, profile=None, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-2") | \
            self.launch(1, profile="head", hpctrain_cluster=cfn.STACK)
        self.handler(self.event("Delete"), cfn.LambdaContext())
        self.assertEqual(self.live(), theirs | untagged | foreign)
        self.assertEqual([(s[0], s[1]) for s in self.sent], [("SUCCESS", f"instances-of-{cfn.STACK}")])
        self.assertEqual(self.pauses.call_count, 1)  # it looked again: none left
        del ours

    def test_a_deletion_without_the_profile_fails_and_says_so(self):
        """(A rollback that paired the new code with the old properties, say): FAILED with the reason,
        never no answer, which would keep CloudFormation waiting for an hour."""
        ours = self.launch(1, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-1")
        event = self.event("Delete")
        del event["ResourceProperties"]["InstanceProfile"]
        self.handler(event, cfn.LambdaContext())
        self.assertEqual(self.sent[0][:3:2], ("FAILED", "KeyError: 'InstanceProfile'"))
        self.assertEqual(self.live(), ours)

    def test_creation_terminates_nothing(self):
        ours = self.launch(1, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-1")
        self.handler(self.event("Create"), cfn.LambdaContext())
        self.assertEqual(self.live(), ours)
        self.assertEqual(self.sent[0][0], "SUCCESS")

    def test_a_deletion_it_cannot_finish_fails(self):
        self.launch(1, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-1")
        real = boto3.client

        def client(*a, **kw):
            c = real(*a, **kw)
            c.terminate_instances = lambda **_: None  # the instances do not go
            return c
        with mock.patch.object(boto3, "client", client):
            self.handler(self.event("Delete"), cfn.LambdaContext(seconds=30))
        status, _, reason, _, _ = self.sent[0]
        self.assertEqual(status, "FAILED")
        self.assertIn("instances still there", reason)

    def shutting_down_slowly(self):
        """One instance of the cluster that EC2 is shutting down, and clients whose TerminateInstances
        leaves it so (as EC2 does: it is terminated when EC2 is done with it)."""
        (slow,) = self.launch(1, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-1")
        self.moto_instance(slow)._state.name = "shutting-down"
        real = boto3.client

        def client(*a, **kw):
            c = real(*a, **kw)
            terminate = c.terminate_instances

            def terminate_instances(InstanceIds):  # noqa: N803 - boto3's name
                self.asked.append(sorted(InstanceIds))
                rest = [i for i in InstanceIds if i != slow]
                return terminate(InstanceIds=rest) if rest else {"TerminatingInstances": []}
            c.terminate_instances = terminate_instances
            return c
        self.asked = []
        return slow, mock.patch.object(boto3, "client", client)

    @staticmethod
    def moto_instance(instance_id):
        return ec2_backends[cfn.ACCOUNT][cfn.REGION].get_instance(instance_id)

    def test_an_instance_shutting_down_is_waited_for(self):
        slow, shutting_down = self.shutting_down_slowly()
        running = self.launch(1, hpctrain_cluster=cfn.STACK, hpctrain_node="gpu-2")
        # EC2 is done with it during the handler's third pause.
        self.pauses.side_effect = lambda _: self.pauses.call_count == 3 and self.moto_instance(slow).terminate()
        with shutting_down:
            self.handler(self.event("Delete"), cfn.LambdaContext())
        self.assertEqual(self.asked, [sorted(running | {slow}), [slow], [slow]])
        self.assertEqual(self.pauses.call_count, 3)
        self.assertEqual(self.live(), set())
        self.assertEqual(self.sent[0][0], "SUCCESS")

    def test_an_instance_still_shutting_down_at_the_deadline_fails_the_deletion(self):
        slow, shutting_down = self.shutting_down_slowly()
        with shutting_down:
            self.handler(self.event("Delete"), cfn.LambdaContext(seconds=30))
        status, _, reason, _, _ = self.sent[0]
        self.assertEqual(status, "FAILED")
        self.assertIn(f"instances still there: ['{slow}']", reason)

    def test_shutting_down_taken_as_gone_fails_those_two(self):
        """The flaw planted into the handler's code: both tests above fail."""
        template = copy.deepcopy(cfn.load_template())
        code = template["Resources"]["CleanupFunction"]["Properties"]["Code"]
        self.assertIn(GONE, code["ZipFile"])
        code["ZipFile"] = code["ZipFile"].replace(GONE, 'GONE = ("terminated", "shutting-down")')
        self.handler = cfn.cleanup_module(template, self.sent).handler
        for test in (self.test_an_instance_shutting_down_is_waited_for,
                     self.test_an_instance_still_shutting_down_at_the_deadline_fails_the_deletion):
            self.sent.clear()
            self.pauses.reset_mock()
            with self.subTest(test.__name__), self.assertRaises(AssertionError):
                test()


if __name__ == "__main__":
    unittest.main()
