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

It also asks EC2 (DescribeInstanceTypes) what each instance type has, against the one shape Slurm
is told for every node (cloud.json's node_shape: ComputeCpus, ComputeGpus, ComputeMemoryMiB): a
node whose slurmd finds fewer vCPUs or GPUs, or less memory, than slurm.conf says is drained
("Low RealMemory") as it registers, and jobs wait for ever for nodes that came up. More than it
finds fails as a refusal does; fewer (CPUs or GPUs a job will never get) is a warning.

    launch_check.py [--wait SECONDS]   (settings: HPCTRAIN_CLOUD_CONFIG, default /etc/hpctrain/cloud.json)

Exit status: 0 when no choice was refused its permissions and every type fits the shape, 1
otherwise, 2 on bad input (the
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
# The share of the memory EC2 lists that Slurm may be told (the kernel and firmware keep the rest,
# 2 to 5%; ParallelCluster gives Slurm 95% too): slurmd finding less than RealMemory drains the node.
MEMORY_SHARE = 0.95


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


def shape_of(ec2, itype):
    """(vCPUs, GPUs, MiB) EC2 lists for an instance type; None, said, where it cannot tell: an
    error string for a type EC2 does not know, or "" where it could not be asked."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        info = ec2.describe_instance_types(InstanceTypes=[itype])["InstanceTypes"]
    except BotoCoreError as e:
        logging.warning("%s: its vCPUs, GPUs and memory not checked: %s", itype, e)
        return None, ""
    except ClientError as e:
        error = e.response.get("Error", {})
        if error.get("Code") == "InvalidInstanceType":
            return None, f"EC2 knows no instance type {itype} ({error.get('Message', '')})"
        logging.warning("%s: its vCPUs, GPUs and memory not checked: %s: %s", itype, error.get("Code", ""),
                        error.get("Message", ""))
        return None, ""
    if not info:
        return None, f"EC2 knows no instance type {itype}"
    t = info[0]
    gpus = sum(g.get("Count", 0) for g in t.get("GpuInfo", {}).get("Gpus", []))
    return (t["VCpuInfo"]["DefaultVCpus"], gpus, t["MemoryInfo"]["SizeInMiB"]), ""


def check_shapes(cfg):
    """Each instance type against node_shape; returns the number of types that cannot run as Slurm's
    nodes."""
    shape = cfg.get("node_shape")
    if not shape:
        return 0
    ec2 = ec2_client(cfg)
    unfit = 0
    for itype in cfg["instance_types"]:
        have, unknown = shape_of(ec2, itype)
        if have is None:
            if unknown:
                unfit += 1
                logging.error("%s: the nodes would never come up", unknown)
            continue
        cpus, gpus, mib = have
        most_mib = int(mib * MEMORY_SHARE)
        errors, warnings = [], []
        for param, told, actual, what in (("ComputeCpus", shape["cpus"], cpus, "vCPUs"),
                                          ("ComputeGpus", shape["gpus"], gpus, "GPUs")):
            if told > actual:
                errors.append(f"{param} is {told}, but it has {actual} {what}")
            elif told < actual:
                warnings.append(f"{param} is {told}, but it has {actual} {what}: jobs never get the other "
                                f"{actual - told}")
        if shape["memory_mib"] > most_mib:
            errors.append(f"ComputeMemoryMiB is {shape['memory_mib']}, more than {most_mib}, {MEMORY_SHARE:.0%} "
                          f"of its {mib} MiB (the kernel keeps the rest)")
        for w in warnings:
            logging.warning("%s: %s", itype, w)
        if errors:
            unfit += 1
            logging.error("%s: %s: slurmd would find less than slurm.conf says, and Slurm would drain every node "
                          "as it registers", itype, "; ".join(errors))
        elif not warnings:
            logging.info("%s: %d vCPUs, %d GPUs and %d MiB fit Slurm's node (%d, %d, %d MiB)", itype, cpus, gpus,
                         mib, shape["cpus"], shape["gpus"], shape["memory_mib"])
    return unfit


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
        unfit = check_shapes(cfg)
    except BotoCoreError as e:  # no EC2 client at all (AWS_PROFILE names no profile, and such)
        print(f"launch_check.py: error: cannot ask EC2: {e}", file=sys.stderr)
        return 2
    problems = []
    if refused:
        problems.append(f"the head node may not launch {refused} of the {len(choices(cfg))} instance choices "
                        "resume.py would try")
    if unfit:
        problems.append(f"{unfit} of the {len(cfg['instance_types'])} instance types do not fit the node Slurm is "
                        "told (ComputeCpus, ComputeGpus, ComputeMemoryMiB)")
    if problems:
        print(f"launch_check.py: error: {'; '.join(problems)} (see the lines above): the cluster's nodes would never "
              "come up" + (" or run a job" if unfit else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
