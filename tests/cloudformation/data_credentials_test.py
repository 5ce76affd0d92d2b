"""Jobs' credentials for the cluster's data (cloudformation/node/data_credentials.py), against
moto's STS and S3: the data role's credentials written at once, readable by every user (0644),
in the shared credentials file a job's boto3 finds with AWS_SHARED_CREDENTIALS_FILE and nothing
else (no access key in the environment, as in a job on a node whose metadata service is root's);
renewed before they expire; a failure is one error line. Who may take the data role and what it
may do is policy_test.py's."""

import configparser
import datetime
import io
import os
import stat
import sys
import tempfile
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "cloudformation", "node"))

try:
    import boto3
    from botocore.exceptions import ClientError
    from moto import mock_aws
except ImportError as e:  # pragma: no cover
    print(f"SKIPPED: {e} (boto3 and moto are needed)")
    sys.exit(77)

import data_credentials  # noqa: E402

REGION = "us-east-1"
TRUST = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}'


class DataCredentials(unittest.TestCase):
    def setUp(self):
        for k, v in {"AWS_ACCESS_KEY_ID": "node-role", "AWS_SECRET_ACCESS_KEY": "node-secret",
                     "AWS_DEFAULT_REGION": REGION}.items():
            self.enterContext(mock.patch.dict(os.environ, {k: v}))
        self.enterContext(mock_aws())
        self.role = boto3.client("iam").create_role(RoleName="hpc-DataRole-X1", AssumeRolePolicyDocument=TRUST)["Role"]["Arn"]
        boto3.client("s3").create_bucket(Bucket="my-datasets")
        boto3.client("s3").put_object(Bucket="my-datasets", Key="fashion-mnist/train.gz", Body=b"data")
        self.out = os.path.join(self.enterContext(tempfile.TemporaryDirectory()), "aws", "credentials")

    def run_main(self, *args):
        argv = ["data_credentials.py", "--role", self.role, "--region", REGION, "--out", self.out, *args]
        with mock.patch.object(sys, "argv", argv), mock.patch("sys.stderr", new_callable=io.StringIO) as err:
            try:
                code = data_credentials.main()
            except SystemExit as e:
                code = e.code
        return code, err.getvalue()

    def test_a_job_reads_the_data_with_the_file_alone(self):
        code, err = self.run_main("--once")
        self.assertEqual(code, 0, err)
        self.assertIn(f"credentials of {self.role} in {self.out} for ", err)
        self.assertEqual(stat.S_IMODE(os.stat(self.out).st_mode), 0o644)
        self.assertEqual(os.listdir(os.path.dirname(self.out)), ["credentials"])  # no temporary left
        ini = configparser.ConfigParser(interpolation=None)
        ini.read(self.out)
        keys = dict(ini["default"])
        self.assertEqual(sorted(keys), ["aws_access_key_id", "aws_secret_access_key", "aws_session_token"])
        self.assertNotEqual(keys["aws_access_key_id"], "node-role")
        # A job: no key in its environment, only the file (as train.sbatch sets it).
        job_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
        with mock.patch.dict(os.environ, {**job_env, "AWS_SHARED_CREDENTIALS_FILE": self.out}, clear=True):
            session = boto3.Session(region_name=REGION)
            creds = session.get_credentials().get_frozen_credentials()
            self.assertEqual((creds.access_key, creds.token), (keys["aws_access_key_id"], keys["aws_session_token"]))
            body = session.client("s3").get_object(Bucket="my-datasets", Key="fashion-mnist/train.gz")["Body"].read()
            self.assertEqual(body, b"data")

    def test_renewed_at_half_life(self):
        """The service renews at half the credentials' life (never less than a minute apart)."""
        pauses = []

        def sleep(seconds):
            pauses.append(seconds)
            if len(pauses) == 2:
                raise KeyboardInterrupt

        with mock.patch.object(data_credentials.time, "sleep", sleep), self.assertRaises(KeyboardInterrupt):
            self.run_main("--duration", "3600")
        self.assertEqual(len(pauses), 2)
        for pause in pauses:
            self.assertTrue(1700 <= pause <= 1800, pauses)

    def test_a_refusal_is_one_error_line(self):
        refused = ClientError({"Error": {"Code": "AccessDenied", "Message": "not authorized to perform sts:AssumeRole"}},
                              "AssumeRole")
        with mock.patch.object(data_credentials, "renew", side_effect=refused):
            code, err = self.run_main("--once")
        self.assertEqual(code, 1)
        self.assertEqual(err.count("\n"), 1)
        self.assertIn("data_credentials.py: error: An error occurred (AccessDenied)", err)
        self.assertFalse(os.path.exists(self.out))
        code, err = self.run_main("--duration", "7200")
        self.assertEqual((code, err.count("\n")), (2, 1))
        self.assertIn("--duration must be 900 to 3600 seconds", err)

    def test_an_sts_endpoint_that_never_answers_fails_within_its_bound(self):
        """The service's renewal, --once here, against an STS endpoint that accepts and never
        answers: one line naming it and the error within the bound (hpc_cloud.aws_client; the
        timeouts shortened, see slurm_fakes.SHORT_TIMEOUTS_DRIVER), not botocore's minutes, so
        that the service tries again well before the old credentials expire."""
        from slurm_fakes import run_with_short_timeouts, silent_endpoint

        endpoint = silent_endpoint(self)
        r = run_with_short_timeouts(self, "data_credentials.py", "--role", self.role, "--region", REGION,
                                    "--out", self.out, "--once", env=dict(os.environ, AWS_ENDPOINT_URL_STS=endpoint))
        self.assertEqual(r.returncode, 1, r.stderr)
        # One line, naming the endpoint (not aws_client's log line too, nor botocore's own).
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertTrue(r.stderr.startswith(f"data_credentials.py: error: {endpoint} gave no answer within 2 s"), r.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_the_text_names_the_role_and_the_expiry(self):
        reply = {"Credentials": {"AccessKeyId": "ASIA1", "SecretAccessKey": "s", "SessionToken": "t",
                                 "Expiration": datetime.datetime(2026, 11, 27, 12, tzinfo=datetime.timezone.utc)},
                 "AssumedRoleUser": {"Arn": "arn:aws:sts::123456789012:assumed-role/hpc-DataRole-X1/hpctrain-data-n1"}}
        text = data_credentials.credentials_text(reply)
        self.assertIn("assumed-role/hpc-DataRole-X1", text.splitlines()[0])
        self.assertIn("aws_session_token = t\n", text)


if __name__ == "__main__":
    unittest.main()
