#!/usr/bin/env python3
"""Asks EC2, before the cluster takes its first job, whether the head node may launch what
resume.py would: a dry run (DryRun, nothing is launched) of resume.py's own RunInstances request
for every choice it may try (market, instance type, subnet). A permission refused
(UnauthorizedOperation: the role's policy, an organization's service control policy, a key
policy) fails the head node's bootstrap, and so the stack, with the choice and EC2's reason,
instead of a cluster whose nodes never come up and whose jobs wait for ever. IAM's changes take a
while to reach EC2 (the role's policies were made minutes before), so a refusal is asked again,
with growing pauses, for up to --wait seconds before it counts. EC2's other answers to a dry run
(an instance type a zone does not offer, spot refused in the account, no answer) are warnings:
resume.py passes on to the next choice for those, as it does when it launches. cfn-hup runs it
again after each stack update that changes the head node's settings (cluster.yaml's "update"
config set): the update is done by then, so a refusal is reported (in the power log, which
reaches the stack's log group) rather than failing anything.

    launch_check.py [--wait SECONDS]   (settings: HPCTRAIN_CLOUD_CONFIG, default /etc/hpctrain/cloud.json)

Exit status: 0 when no choice was refused its permissions, 1 when one was, 2 on bad input (the
settings, or an AWS configuration that makes no EC2 client: AWS_PROFILE naming no profile).
"""

import logging
import sys
import time

from hpc_cloud import ConfigError, OneLineParser, ec2_client, load_config, setup_logging
from resume import choices, market_of, request_for

# EC2's answer to a dry run that would have been allowed, and to one refused its permissions.
ALLOWED = "DryRunOperation"
REFUSED = "UnauthorizedOperation"
# The node name the dry runs' tags carry (the policies check the tags' keys and the cluster's).
CHECK_NODE = "launch-check"


def describe(choice):
    spot, itype, subnet = choice
    return f"{market_of(choice)} {itype or 'the template instance type'} in {subnet or 'the template network'}"


def dry_run(ec2, cfg, choice, deadline):
    """(EC2's error code for this choice's dry run, its message); asked again while the permission
    is refused and time is left before `deadline` (monotonic)."""
    from botocore.exceptions import BotoCoreError, ClientError

    request = request_for(cfg, CHECK_NODE, choice, "")
    del request["ClientToken"]  # (a dry run launches nothing to be idempotent about)
    pause = 5
    while True:
        try:
            ec2.run_instances(DryRun=True, **request)
            return "", "EC2 answered a dry run without DryRunOperation"
        except BotoCoreError as e:
            return "no answer", str(e)
        except ClientError as e:
            error = e.response.get("Error", {})
            code, message = error.get("Code", ""), error.get("Message", "")
        if code != REFUSED or time.monotonic() + pause > deadline:
            return code, message
        logging.info("%s: refused for now (%s); asking again in %d s (IAM's changes take a while to reach EC2)",
                     describe(choice), code, pause)
        time.sleep(pause)
        pause = min(2 * pause, 30)


def check(cfg, wait):
    """Dry-runs every choice; returns the number refused their permissions."""
    ec2 = ec2_client(cfg)
    deadline = time.monotonic() + wait
    refused = 0
    every = choices(cfg)
    for n, choice in enumerate(every):
        code, message = dry_run(ec2, cfg, choice, deadline)
        if code == "no answer":  # (the client gives up for the run: the choices after it would fail at once)
            logging.warning("%s%s: not checked: %s", describe(choice),
                            f" and the {len(every) - n - 1} choices after it" if n + 1 < len(every) else "", message)
            break
        if code == ALLOWED:
            logging.info("%s: may be launched", describe(choice))
        elif code == REFUSED:
            refused += 1
            logging.error("%s: the head node may not launch it: %s: %s (aws sts decode-authorization-message "
                          "--encoded-message ... shows which policy refused it)", describe(choice), code, message)
        else:
            logging.warning("%s: EC2 refused a dry run: %s: %s (resume.py passes on to the next choice for this)",
                            describe(choice), code, message)
    return refused


def main(argv=None):
    parser = OneLineParser(prog="launch_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--wait", type=float, default=300, metavar="SECONDS",
                        help="how long a refused permission is asked again before it counts (default 300)")
    args = parser.parse_args(argv)
    if not 0 <= args.wait <= 3600:
        parser.error(f"--wait must be 0 to 3600 seconds, got {args.wait:g}")
    try:
        cfg = load_config()
    except (ConfigError, ValueError) as e:
        print(f"launch_check.py: error: {e}", file=sys.stderr)
        return 2
    setup_logging(cfg, "launch_check.py")
    from botocore.exceptions import BotoCoreError

    try:
        refused = check(cfg, args.wait)
    except BotoCoreError as e:  # no EC2 client at all (AWS_PROFILE names no profile, and such)
        print(f"launch_check.py: error: cannot ask EC2: {e}", file=sys.stderr)
        return 2
    if refused:
        print(f"launch_check.py: error: the head node may not launch {refused} of the {len(choices(cfg))} "
              "instance choices resume.py would try (see the lines above): the cluster's nodes would never "
              "come up", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
