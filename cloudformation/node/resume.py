#!/usr/bin/env python3
"""Slurm's ResumeProgram: launches one EC2 instance per node name Slurm asks for, from the
cluster's launch template, tagged with the node's name, and tells Slurm each instance's address
(scontrol update nodeaddr/nodehostname). With market "spot" it asks for spot capacity first and
falls back to on-demand when spot has none (spot_fallback). A node that gets no instance is set
down with EC2's reason, so that Slurm requeues the job that asked for it.

    resume.py NODELIST        e.g. resume.py gpu-[1-3]   (slurm.conf: ResumeProgram=...)
"""

import logging
import sys
import time

from hpc_cloud import CAPACITY_ERRORS, CLUSTER_TAG, NODE_TAG, ec2_client, instances_of, main_wrapper, scontrol, set_down


def launch(ec2, cfg, node, spot, subnet):
    # The on-demand fallback uses the on-demand template where the stack made one (the spot
    # template's market options cannot be switched off in the request).
    template = cfg["launch_template_id"] if spot else cfg.get("fallback_launch_template_id") or cfg["launch_template_id"]
    request = {
        "LaunchTemplate": {"LaunchTemplateId": template, "Version": "$Latest"},
        "MinCount": 1,
        "MaxCount": 1,
        "TagSpecifications": [
            {"ResourceType": "instance",
             "Tags": [{"Key": CLUSTER_TAG, "Value": cfg["cluster"]}, {"Key": NODE_TAG, "Value": node},
                      {"Key": "Name", "Value": f"{cfg['cluster']}-{node}"}]},
        ],
    }
    if subnet:
        request["SubnetId"] = subnet
    if spot:
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return ec2.run_instances(**request)["Instances"][0]["InstanceId"]


def resume(cfg, nodes):
    from botocore.exceptions import ClientError

    ec2 = ec2_client(cfg)
    existing = instances_of(ec2, cfg, nodes)
    markets = [True, False] if cfg["market"] == "spot" and cfg["spot_fallback"] else [cfg["market"] == "spot"]
    subnets = cfg["subnet_ids"] or [None]
    launched, failed = {}, 0
    for node in nodes:
        if node in existing:  # asked twice (a retry): keep the instance it has
            launched[node] = existing[node][0]
            logging.info("%s: already has %s", node, existing[node][0])
            continue
        reason = ""
        for spot in markets:
            for subnet in subnets:
                try:
                    launched[node] = launch(ec2, cfg, node, spot, subnet)
                    logging.info("%s: launched %s (%s%s)", node, launched[node], "spot" if spot else "on-demand",
                                 f", {subnet}" if subnet else "")
                    break
                except ClientError as e:
                    code = e.response.get("Error", {}).get("Code", "")
                    reason = f"{code}: {e.response.get('Error', {}).get('Message', '')}"
                    logging.warning("%s: %s launch failed: %s", node, "spot" if spot else "on-demand", reason)
                    if code not in CAPACITY_ERRORS:
                        break  # not a capacity problem: another market or subnet will not help
            if node in launched:
                break
        if node not in launched:
            failed += 1
            set_down(node, f"resume failed: {reason}" if reason else "resume failed")
    register_addresses(ec2, launched)
    return 1 if failed else 0


def register_addresses(ec2, launched, timeout=120):
    """Waits for each new instance's private address and gives it to Slurm."""
    pending = dict(launched)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        reply = ec2.describe_instances(InstanceIds=list(pending.values()))
        for reservation in reply["Reservations"]:
            for inst in reservation["Instances"]:
                node = next(n for n, i in pending.items() if i == inst["InstanceId"])
                ip = inst.get("PrivateIpAddress")
                if ip:
                    host = inst.get("PrivateDnsName") or ip
                    scontrol("update", f"nodename={node}", f"nodeaddr={ip}", f"nodehostname={host.split('.')[0]}")
                    logging.info("%s: %s at %s", node, inst["InstanceId"], ip)
                    del pending[node]
        if pending:
            time.sleep(2)
    for node, instance in pending.items():
        logging.error("%s: %s has no address after %d s", node, instance, timeout)


if __name__ == "__main__":
    sys.exit(main_wrapper("resume.py", resume))
