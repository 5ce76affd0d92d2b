#!/usr/bin/env python3
"""Installs the cluster's munge key from Secrets Manager on the head node (the stack generates
it; only the head node's role may read it, and the head node serves it to the compute nodes:
export_munge_key.py): written atomically to --out (default /etc/munge/munge.key),
mode 0400, owned by the munge user when there is one. The key never touches /shared.

    fetch_munge_key.py --secret ARN --region REGION [--out PATH]
"""

import pwd
import sys

from hpc_cloud import OneLineParser, aws_client, region_arg, write_atomically

# Seconds the GetSecretValue call may try (hpc_cloud.aws_client): the head node's bootstrap waits
# for it, and an endpoint that never answers fails it within aws_worst_case(60) = 110 s (the
# bootstrap then fails, and the stack with it, instead of hanging until the stack's own timeout).
DEADLINE = 60


def install_key(key, out):
    if len(key) < 32:
        raise ValueError(f"the secret holds {len(key)} bytes: munge needs at least 32")
    try:
        munge = pwd.getpwnam("munge")
        owner = (munge.pw_uid, munge.pw_gid)
    except KeyError:
        owner = None  # no munge user (a test): root's
    write_atomically(out, key, 0o400, owner)


def main():
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--secret", required=True, help="the secret's ARN")
    p.add_argument("--region", required=True, type=region_arg)
    p.add_argument("--out", default="/etc/munge/munge.key")
    a = p.parse_args()
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        reply = aws_client("secretsmanager", a.region, DEADLINE).get_secret_value(SecretId=a.secret)
        key = reply["SecretString"].encode() if "SecretString" in reply else reply["SecretBinary"]
        install_key(key, a.out)
    except (BotoCoreError, ClientError, OSError, ValueError) as e:
        print(f"fetch_munge_key.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
