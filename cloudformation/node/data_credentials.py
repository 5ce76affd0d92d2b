#!/usr/bin/env python3
"""Jobs' credentials for the cluster's data, and nothing else: a root service on every compute node
(hpctrain-data-credentials.service). The nodes' metadata service, and so their own role, is for
root only (imds_firewall.sh); this service assumes the stack's data role, which may only read
DataBucket and write under ResultsPrefix, and keeps its short-lived credentials in --out (an AWS
shared credentials file, mode 0644: every user's jobs may read the data), renewed well before
they expire. slurm/train.sbatch and sweep.sbatch (slurm/job.sh) point AWS_SHARED_CREDENTIALS_FILE at it,
so that `hpcdata stage` (STAGE_FROM) finds them; any boto3 or AWS CLI program does with that variable set.

    data_credentials.py --role ARN --region REGION [--out FILE] [--duration SECONDS] [--once]
"""

import configparser
import io
import logging
import os
import socket
import sys
import time

from hpc_cloud import OneLineParser, aws_client, region_arg, write_atomically

DEFAULT_OUT = "/run/hpctrain/aws/credentials"
# Seconds an AssumeRole call may try (hpc_cloud.aws_client): credentials are renewed with at least
# half of --duration (900 s at least) left, and a failed renewal is tried again 60 s later. An STS
# endpoint that never answers fails a try within aws_worst_case(30) = 80 s, so that 3 tries fit
# in the 450 s before the old credentials expire (botocore's defaults: up to 10 minutes for one).
STS_DEADLINE = 30


def credentials_text(reply):
    """The shared credentials file's text for an AssumeRole reply (profile "default")."""
    c = reply["Credentials"]
    ini = configparser.ConfigParser(interpolation=None)
    ini["default"] = {"aws_access_key_id": c["AccessKeyId"], "aws_secret_access_key": c["SecretAccessKey"],
                      "aws_session_token": c["SessionToken"]}
    out = io.StringIO()
    out.write(f"# The cluster's data role ({reply['AssumedRoleUser']['Arn']}), until {c['Expiration']}:\n"
              "# written by data_credentials.py, renewed before then. Read DataBucket, write ResultsPrefix only.\n")
    ini.write(out)
    return out.getvalue()


def renew(sts, args):
    """Assumes the data role and writes its credentials; returns their lifetime in seconds."""
    reply = sts.assume_role(RoleArn=args.role, RoleSessionName=f"hpctrain-data-{socket.gethostname()}"[:64],
                            DurationSeconds=args.duration)
    os.makedirs(os.path.dirname(args.out), mode=0o755, exist_ok=True)
    write_atomically(args.out, credentials_text(reply), 0o644)  # (every user's jobs read it)
    left = reply["Credentials"]["Expiration"].timestamp() - time.time()
    logging.info("credentials of %s in %s for %.0f s", args.role, args.out, left)
    return left


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", required=True, help="the data role's ARN")
    p.add_argument("--region", required=True, type=region_arg)
    p.add_argument("--out", default=DEFAULT_OUT, help="the credentials file (default %(default)s)")
    p.add_argument("--duration", type=int, default=3600, help="seconds each credential lasts (900 to 3600)")
    p.add_argument("--once", action="store_true", help="write them once and exit")
    args = p.parse_args()
    if not 900 <= args.duration <= 3600:
        p.error(f"--duration must be 900 to 3600 seconds (the role's limit), not {args.duration}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s data_credentials: %(levelname)s: %(message)s")
    logging.getLogger("botocore").setLevel(logging.WARNING)  # (not its "Found credentials" on every run)
    from botocore.exceptions import BotoCoreError, ClientError

    # (The next renewal tries again; the error line below names an endpoint that gave no answer, once.)
    try:
        sts = aws_client("sts", args.region, STS_DEADLINE, give_up_for_the_run=False)
    except BotoCoreError as e:  # (AWS_PROFILE names no profile, and such: no renewal would help)
        print(f"data_credentials.py: error: {e}", file=sys.stderr)
        return 1
    while True:
        try:
            left = renew(sts, args)
            pause = max(60.0, left / 2)  # renewed at half-life: jobs never read expired ones
        except (BotoCoreError, ClientError, OSError) as e:
            if args.once:
                print(f"data_credentials.py: error: {e}", file=sys.stderr)
                return 1
            logging.error("cannot renew the credentials (the old ones stay until they expire): %s", e)
            pause = 60.0
        if args.once:
            return 0
        time.sleep(pause)


if __name__ == "__main__":
    sys.exit(main())
