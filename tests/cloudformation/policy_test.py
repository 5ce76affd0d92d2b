"""The stack's IAM policies, evaluated the way AWS evaluates them, against the requests the node
programs really send (moto does not evaluate IAM at all).

The policies come from cloudformation/cluster.yaml resolved for given parameters (tests/
cloudformation/cfn.py). A power-up is resume.py's own RunInstances request (request_for, fed
the cloud.json the head node gets) for every choice it may try, authorized as EC2 authorizes
RunInstances: once per resource the launch uses or creates (the launch template, the image,
key pair, placement group, subnet, security group, and the instance, volume, network interface
and spot request it creates), each with its condition keys (ec2:LaunchTemplate,
ec2:IsLaunchTemplateResource, ec2:InstanceType, the instance's metadata options
(ec2:MetadataHttpTokens, ec2:MetadataHttpPutResponseHopLimit), each volume's ec2:Encrypted, all
as the launch overrides the template, and the tags requested for that resource type
as aws:RequestTag/... and aws:TagKeys: tag-on-create), plus ec2:CreateTags for each resource
type tagged (ec2:CreateAction) and iam:PassRole for the launch template's role. Then:

  - everything the cluster does is allowed (power-up, suspend, cleanup, logs, munge key, data,
    the cluster manager's metrics);
  - a long list of what it must not do is denied (a power-up lacking a tag on any resource, or
    with another cluster's tag, another template, image, key, type, subnet or group, IMDSv1, a
    hop limit over 1 or an unencrypted volume; tagging
    outside a launch; terminating another cluster's instance or the head node; passing another
    role; reading another secret, bucket or prefix; a metric in another namespace; ...);
  - for every statement of every role, each planted mutation (one condition removed, the
    resource widened to "*", the action widened to its service's "*") makes one of the above
    fail: no statement holds a condition or a scope that nothing checks.
"""

import copy
import fnmatch
import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cfn  # noqa: E402

sys.path.insert(0, cfn.NODE_DIR)
import clustermgtd  # noqa: E402
import hpc_cloud  # noqa: E402
import resume  # noqa: E402

ARN = f"arn:aws:ec2:{cfn.REGION}:{cfn.ACCOUNT}"


# ------------------------------------------------------------------------- IAM evaluation
def listify(v):
    return v if isinstance(v, list) else [v]


def glob(pattern, value, case=True):
    if not case:
        pattern, value = pattern.lower(), value.lower()
    return fnmatch.fnmatchcase(value, pattern)


def compare(op, wanted, have):
    """One condition operator (without set qualifier) on one request value."""
    if op in ("StringEquals", "ArnEquals"):
        return have == wanted
    if op in ("StringLike", "ArnLike"):
        return glob(wanted, have)
    if op == "Bool":
        return str(have).lower() == str(wanted).lower()
    numeric = {"NumericEquals": float.__eq__, "NumericLessThan": float.__lt__, "NumericLessThanEquals": float.__le__,
               "NumericGreaterThan": float.__gt__, "NumericGreaterThanEquals": float.__ge__}
    if op in numeric:
        try:
            return numeric[op](float(have), float(wanted))
        except ValueError:
            return False  # (a value that is not a number matches no numeric operator)
    raise ValueError(f"condition operator {op} is not modelled")


def condition_holds(op, key, wanted, ctx):
    wanted = [str(w) for w in listify(wanted)]
    have = ctx.get(key)
    if op == "Null":
        return (have is None) == (wanted[0] == "true")
    if op.startswith("ForAllValues:"):  # every requested value is allowed (none: true)
        return all(any(compare(op.split(":")[1], w, h) for w in wanted) for h in listify(have or []))
    if op.startswith("ForAnyValue:"):
        return any(any(compare(op.split(":")[1], w, h) for w in wanted) for h in listify(have or []))
    if op.endswith("IfExists") and have is None:
        return True
    if have is None:
        return False  # a key the request lacks fails every plain operator
    return any(compare(op.removesuffix("IfExists"), w, h) for w in wanted for h in listify(have))


def principal_matches(st, principal):
    """A resource policy's Principal: "*", or {"AWS": ARNs}, of which a role's ARN covers its
    sessions (an instance's credentials). An identity policy (no Principal) applies to its role."""
    if "Principal" not in st:
        return True
    given = st["Principal"] if st["Principal"] == "*" else st["Principal"].get("AWS", [])
    return "*" in listify(given) or (principal is not None and principal in listify(given))


def applies(st, action, resource, ctx, principal=None):
    if not any(glob(a, action, case=False) for a in listify(st["Action"])):
        return False
    # (a statement of a resource's own policy without Resource is about that resource)
    if "Resource" in st and not any(glob(r, resource) for r in listify(st["Resource"])):
        return False
    if not principal_matches(st, principal):
        return False
    return all(condition_holds(op, key, wanted, ctx)
               for op, keys in st.get("Condition", {}).items() for key, wanted in keys.items())


def allowed(statements, action, resource, ctx=None, principal=None):
    """Whether `principal` (None: an anonymous client, for a resource policy) may."""
    ctx = ctx or {}
    if any(st["Effect"] == "Deny" and applies(st, action, resource, ctx, principal) for st in statements):
        return False
    return any(st["Effect"] == "Allow" and applies(st, action, resource, ctx, principal) for st in statements)


# ------------------------------------------------------------------------- what is asked
def request_tags(req, resource_type):
    tags = {t["Key"]: t["Value"] for spec in req.get("TagSpecifications", []) if spec["ResourceType"] == resource_type
            for t in spec["Tags"]}
    ctx = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    if tags:
        ctx["aws:TagKeys"] = list(tags)
    return ctx


# Which values EC2 puts in a RunInstances' condition keys where the launch template gives them
# and the request does not: the template's (the launch's effective values, as the ec2:IsLaunchTemplateResource
# key suggests) or none (the request's own parameters alone). AWS's documentation does not say
# outright; the policies must allow the cluster's launches and refuse the rest under both.
KEY_SOURCES = ("effective", "request")


def run_instances_checks(r, req, keys="effective"):
    """[(action, resource ARN, condition context)] that EC2 authorizes for this RunInstances."""
    lt_id = req["LaunchTemplate"]["LaunchTemplateId"]
    lt_logical = next((k for k, v in r.template["Resources"].items()
                       if v["Type"] == "AWS::EC2::LaunchTemplate" and r.physical(k) == lt_id), None)
    data = r.resource(lt_logical)["Properties"]["LaunchTemplateData"] if lt_logical else {}
    lt = {"ec2:LaunchTemplate": f"{ARN}:launch-template/{lt_id}"}

    def from_template(field):
        return {**lt, "ec2:IsLaunchTemplateResource": "false" if field in req else "true"}
    checks = [("ec2:RunInstances", f"{ARN}:launch-template/{lt_id}", lt),
              ("ec2:RunInstances", f"arn:aws:ec2:{cfn.REGION}::image/{req.get('ImageId', data.get('ImageId'))}",
               from_template("ImageId"))]
    if req.get("KeyName", data.get("KeyName")):
        checks.append(("ec2:RunInstances", f"{ARN}:key-pair/{req.get('KeyName', data.get('KeyName'))}",
                       from_template("KeyName")))
    if data.get("Placement", {}).get("GroupName"):
        checks.append(("ec2:RunInstances", f"{ARN}:placement-group/{data['Placement']['GroupName']}",
                       from_template("Placement")))
    for ni in req.get("NetworkInterfaces") or data.get("NetworkInterfaces") or []:
        net = from_template("NetworkInterfaces")
        checks.append(("ec2:RunInstances", f"{ARN}:subnet/{ni['SubnetId']}", net))
        checks += [("ec2:RunInstances", f"{ARN}:security-group/{g}", net) for g in ni.get("Groups", [])]
        checks.append(("ec2:RunInstances", f"{ARN}:network-interface/*",
                       {**lt, "ec2:Subnet": f"{ARN}:subnet/{ni['SubnetId']}", **request_tags(req, "network-interface")}))
    # (the launch's own values where it gives them, else the template's: what the instance gets;
    # or, keys="request", only what the launch gives)
    effective = keys == "effective"
    metadata = {**(data.get("MetadataOptions", {}) if effective else {}), **req.get("MetadataOptions", {})}
    instance = {**lt, "ec2:InstanceType": req.get("InstanceType", data.get("InstanceType")), **request_tags(req, "instance")}
    if "HttpTokens" in metadata:
        instance["ec2:MetadataHttpTokens"] = metadata["HttpTokens"]
    if "HttpPutResponseHopLimit" in metadata:
        instance["ec2:MetadataHttpPutResponseHopLimit"] = str(metadata["HttpPutResponseHopLimit"])
    checks.append(("ec2:RunInstances", f"{ARN}:instance/*", instance))
    for mapping in req.get("BlockDeviceMappings") or data.get("BlockDeviceMappings") or []:
        volume = {**lt, **request_tags(req, "volume")}
        if "Encrypted" in mapping.get("Ebs", {}) and (effective or "BlockDeviceMappings" in req):
            volume["ec2:Encrypted"] = str(mapping["Ebs"]["Encrypted"]).lower()
        checks.append(("ec2:RunInstances", f"{ARN}:volume/*", volume))
    market = req.get("InstanceMarketOptions") or data.get("InstanceMarketOptions")
    if market and market["MarketType"] == "spot":
        checks.append(("ec2:RunInstances", f"{ARN}:spot-instances-request/*", {**lt, **request_tags(req, "spot-instances-request")}))
    for spec in req.get("TagSpecifications", []):
        checks.append(("ec2:CreateTags", f"{ARN}:{spec['ResourceType']}/*",
                       {"ec2:CreateAction": "RunInstances", **request_tags(req, spec["ResourceType"])}))
    profile = data.get("IamInstanceProfile", {}).get("Arn")
    if profile:
        logical = next(k for k, v in r.template["Resources"].items()
                       if v["Type"] == "AWS::IAM::InstanceProfile" and r.attribute(k, "Arn") == profile)
        for role in r.template["Resources"][logical]["Properties"]["Roles"]:
            checks.append(("iam:PassRole", r.attribute(role["Ref"], "Arn"), {"iam:PassedToService": "ec2.amazonaws.com"}))
    return checks


def head_node_config(r):
    """cloud.json as the head node gets it, loaded by the programs' own loader."""
    files = r.resource("HeadNode")["Metadata"]["AWS::CloudFormation::Init"]["settings"]["files"]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(files["/etc/hpctrain/cloud.json"]["content"])
    try:
        cfg = hpc_cloud.load_config(f.name)
    finally:
        os.unlink(f.name)
    cfg["controller"] = "ip-10-42-16-5.ec2.internal"
    return cfg


def power_ups(r):
    """resume.py's RunInstances requests for every choice it may try, as it builds them."""
    cfg = head_node_config(r)
    return [resume.request_for(cfg, "gpu-1", choice, "token") for choice in resume.choices(cfg)]


# ------------------------------------------------------------------------- the cases
FULL = {"Market": "spot", "ComputeInstanceTypes": "g5.12xlarge,g6.12xlarge", "UseEfa": "true", "ComputeZones": "1",
        "DataBucket": "my-datasets", "ResultsPrefix": "results/"}
ROLES = ("HeadNodeRole", "ComputeRole", "CleanupRole", "ImagesRole", "DataRole")


def without_tags(req, resource_type):
    req = copy.deepcopy(req)
    req["TagSpecifications"] = [s for s in req["TagSpecifications"] if s["ResourceType"] != resource_type]
    return req


def with_tag(req, resource_type, key, value):
    req = copy.deepcopy(req)
    for spec in req["TagSpecifications"]:
        if spec["ResourceType"] == resource_type:
            spec["Tags"] = [t for t in spec["Tags"] if t["Key"] != key] + [{"Key": key, "Value": value}]
    return req


def changed(req, **fields):
    req = copy.deepcopy(req)
    req.update(fields)
    return req


def cases(r, keys="effective"):
    """(what, role, [checks], whether allowed): the cluster's needs and what it must not do, with
    RunInstances' condition keys from `keys` (KEY_SOURCES)."""
    def launch(req):
        return run_instances_checks(r, req, keys)
    instance = f"{ARN}:instance/i-0123456789abcdef0"
    # A compute instance: its tags and the profile its launch template gives it (ec2:InstanceProfile).
    profile = r.resource("ComputeLaunchTemplate")["Properties"]["LaunchTemplateData"]["IamInstanceProfile"]["Arn"]
    compute_tags = {"ec2:ResourceTag/hpctrain:cluster": cfn.STACK, "ec2:ResourceTag/hpctrain:node": "gpu-1",
                    "ec2:InstanceProfile": profile}
    head_tags = {"ec2:ResourceTag/hpctrain:cluster": cfn.STACK, "ec2:InstanceProfile": r.attribute("HeadNodeInstanceProfile", "Arn")}
    other_tags = {**compute_tags, "ec2:ResourceTag/hpctrain:cluster": "other"}
    # Tagged as the cluster's compute node by someone else (ec2:CreateTags): no profile, or another.
    spoofed = {"ec2:ResourceTag/hpctrain:cluster": cfn.STACK, "ec2:ResourceTag/hpctrain:node": "gpu-1"}
    spoofed_other = {**spoofed, "ec2:InstanceProfile": f"arn:aws:iam::{cfn.ACCOUNT}:instance-profile/other"}
    secret = r.physical("MungeKey")
    log_stream = f"arn:aws:logs:{cfn.REGION}:{cfn.ACCOUNT}:log-group:{r.physical('LogGroup')}:log-stream:i-1/power"
    other_stream = f"arn:aws:logs:{cfn.REGION}:{cfn.ACCOUNT}:log-group:/other:log-stream:x"
    out = []
    ups = power_ups(r)
    for i, req in enumerate(ups):
        out.append((f"power-up choice {i}", "HeadNodeRole", launch(req), True))
    # A spot power-up where there is one (it creates every kind of resource), else the first.
    req = next((u for u in ups if "InstanceMarketOptions" in u), ups[0])
    for rt in [s["ResourceType"] for s in req["TagSpecifications"]]:
        out.append((f"power-up without tags on the {rt}", "HeadNodeRole",
                    launch(without_tags(req, rt)), False))
        out.append((f"power-up tagging the {rt} for another cluster", "HeadNodeRole",
                    launch(with_tag(req, rt, "hpctrain:cluster", "other")), False))
        out.append((f"power-up with another tag key on the {rt}", "HeadNodeRole",
                    launch(with_tag(req, rt, "Owner", "x")), False))
    ni = req["NetworkInterfaces"][0]
    for what, bad in (("another launch template", changed(req, LaunchTemplate={"LaunchTemplateId": "lt-0other", "Version": "1"})),
                      ("another image", changed(req, ImageId="ami-0other")),
                      ("another key pair", changed(req, KeyName="other-key")),
                      ("an instance type not allowed", changed(req, InstanceType="p5.48xlarge")),
                      ("another subnet", changed(req, NetworkInterfaces=[{**ni, "SubnetId": "subnet-0other"}])),
                      ("another security group", changed(req, NetworkInterfaces=[{**ni, "Groups": ["sg-0other"]}])),
                      ("IMDSv1 allowed", changed(req, MetadataOptions={"HttpTokens": "optional"})),
                      ("the metadata token reachable from containers", changed(req, MetadataOptions={"HttpPutResponseHopLimit": 2})),
                      ("an unencrypted root volume",
                       changed(req, BlockDeviceMappings=[{"DeviceName": "/dev/sda1",
                                                          "Ebs": {"VolumeSize": 200, "VolumeType": "gp3", "Encrypted": False}}]))):
        out.append((f"power-up with {what}", "HeadNodeRole", launch(bad), False))
    # Each resource of a launch through another template, alone (the whole launch fails anyway on
    # the template itself): every statement must require the cluster's templates.
    other_lt = f"{ARN}:launch-template/lt-0other"
    checks = launch(req)
    for action, resource, ctx in checks:
        if action == "ec2:RunInstances" and "launch-template/" not in resource:
            out.append((f"{resource} through another template", "HeadNodeRole",
                        [(action, resource, {**ctx, "ec2:LaunchTemplate": other_lt})], False))
        # The same resources for a fleet (which launches through templates too): RunInstances only.
        out.append((f"CreateFleet: {resource}", "HeadNodeRole", [("ec2:CreateFleet", resource, ctx)], False))
    lt = {"ec2:LaunchTemplate": checks[0][2]["ec2:LaunchTemplate"]}
    west = ARN.replace(cfn.REGION, "us-west-2")
    out += [
        ("another subnet, even one the template named", "HeadNodeRole",
         [("ec2:RunInstances", f"{ARN}:subnet/subnet-0other", {**lt, "ec2:IsLaunchTemplateResource": "true"})], False),
        ("tag at launch for another cluster", "HeadNodeRole",
         [("ec2:CreateTags", f"{ARN}:instance/*", {"ec2:CreateAction": "RunInstances", "aws:RequestTag/hpctrain:cluster": "other"})], False),
        ("tag at launch a security group", "HeadNodeRole",
         [("ec2:CreateTags", f"{ARN}:security-group/sg-1", {"ec2:CreateAction": "RunInstances",
                                                            "aws:RequestTag/hpctrain:cluster": cfn.STACK})], False),
        ("change a launch template", "HeadNodeRole",
         [("ec2:CreateLaunchTemplateVersion", f"{ARN}:launch-template/{r.physical('ComputeLaunchTemplate')}", {})], False),
        ("delete this stack", "HeadNodeRole", [("cloudformation:DeleteStack", r.ref("AWS::StackId"), {})], False),
    ]
    out += [(f"{what} in another region", "HeadNodeRole",
             [("ec2:RunInstances", f"{west}:{kind}/*", c) for a, res, c in checks
              if a == "ec2:RunInstances" and res.endswith(f":{kind}/*")], False)
            for what, kind in (("an instance", "instance"), ("a volume", "volume"))]
    # Only the checks that differ: a check the request has anyway says nothing.
    out += [
        ("tag an instance outside a launch", "HeadNodeRole",
         [("ec2:CreateTags", instance, {"aws:RequestTag/hpctrain:cluster": cfn.STACK, "aws:TagKeys": ["hpctrain:cluster"]})], False),
        ("suspend: terminate a compute instance", "HeadNodeRole", [("ec2:TerminateInstances", instance, compute_tags)], True),
        ("terminate another cluster's instance", "HeadNodeRole", [("ec2:TerminateInstances", instance, other_tags)], False),
        ("terminate a namesake's instance in another region", "HeadNodeRole",
         [("ec2:TerminateInstances", instance.replace(cfn.REGION, "us-west-2"), compute_tags)], False),
        ("terminate an untagged instance", "HeadNodeRole", [("ec2:TerminateInstances", instance, {})], False),
        ("terminate an instance tagged as a compute node, without a profile", "HeadNodeRole",
         [("ec2:TerminateInstances", instance, spoofed)], False),
        ("terminate an instance tagged as a compute node, with another profile", "HeadNodeRole",
         [("ec2:TerminateInstances", instance, spoofed_other)], False),
        ("terminate the head node itself", "HeadNodeRole", [("ec2:TerminateInstances", instance, head_tags)], False),
        ("terminate the head node itself, given the compute profile (its association replaced)", "HeadNodeRole",
         [("ec2:TerminateInstances", instance, {**head_tags, "ec2:InstanceProfile": profile})], False),
        ("stop a compute instance", "HeadNodeRole", [("ec2:StopInstances", instance, compute_tags)], False),
        ("delete a volume", "HeadNodeRole", [("ec2:DeleteVolume", f"{ARN}:volume/vol-1", {})], False),
        ("list instances and subnets, and what an instance type has (launch_check.py)", "HeadNodeRole",
         [("ec2:DescribeInstances", "*", {}), ("ec2:DescribeSubnets", "*", {}), ("ec2:DescribeInstanceTypes", "*", {})],
         True),
        ("pass the head node's role", "HeadNodeRole",
         [("iam:PassRole", r.attribute("HeadNodeRole", "Arn"), {"iam:PassedToService": "ec2.amazonaws.com"})], False),
        ("pass the compute role to Lambda", "HeadNodeRole",
         [("iam:PassRole", r.attribute("ComputeRole", "Arn"), {"iam:PassedToService": "lambda.amazonaws.com"})], False),
        ("signal this stack", "HeadNodeRole",
         [("cloudformation:SignalResource", r.ref("AWS::StackId"), {}),
          ("cloudformation:DescribeStackResource", r.ref("AWS::StackId"), {})], True),
        ("clustermgtd: put the protected-mode metrics", "HeadNodeRole",
         [("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": clustermgtd.METRIC_NAMESPACE})], True),
        ("put metrics in another namespace", "HeadNodeRole",
         [("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "AWS/EC2"})], False),
        ("compute: put metrics", "ComputeRole",
         [("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": clustermgtd.METRIC_NAMESPACE})], False),
        ("signal another stack", "HeadNodeRole",
         [("cloudformation:SignalResource", f"arn:aws:cloudformation:{cfn.REGION}:{cfn.ACCOUNT}:stack/other/1", {})], False),
        ("cleanup: terminate the cluster's instances", "CleanupRole",
         [("ec2:DescribeInstances", "*", {}), ("ec2:TerminateInstances", instance, compute_tags)], True),
        ("cleanup: terminate the head node (CloudFormation's to delete)", "CleanupRole",
         [("ec2:TerminateInstances", instance, head_tags)], False),
        ("cleanup: terminate an instance tagged for the cluster, without a profile", "CleanupRole",
         [("ec2:TerminateInstances", instance, spoofed)], False),
        ("cleanup: terminate an instance tagged for the cluster, with another profile", "CleanupRole",
         [("ec2:TerminateInstances", instance, spoofed_other)], False),
        ("cleanup: terminate another cluster's instance", "CleanupRole", [("ec2:TerminateInstances", instance, other_tags)], False),
        ("cleanup: terminate a namesake's instance in another region", "CleanupRole",
         [("ec2:TerminateInstances", instance.replace(cfn.REGION, "us-west-2"), compute_tags)], False),
        ("cleanup: terminate an untagged instance", "CleanupRole", [("ec2:TerminateInstances", instance, {})], False),
        ("cleanup: read the munge key", "CleanupRole", [("secretsmanager:GetSecretValue", secret, {})], False),
        ("cleanup: stop an instance", "CleanupRole", [("ec2:StopInstances", instance, compute_tags)], False),
        ("compute: launch", "ComputeRole", launch(ups[0]), False),
        ("compute: terminate an instance of the cluster", "ComputeRole", [("ec2:TerminateInstances", instance, compute_tags)], False),
    ]
    ssm = f"arn:aws:ssm:{cfn.REGION}"
    own = f"{ssm}:{cfn.ACCOUNT}:parameter"
    out += [
        ("images: resolve the images' public parameters", "ImagesRole",
         [("ssm:GetParameter", f"{ssm}::parameter{r.params[p]}", {}) for p in ("HeadNodeAmi", "ComputeAmi")
          if r.params[p].startswith("/aws/service/")], True),
        ("images: resolve a public parameter of another region", "ImagesRole",
         [("ssm:GetParameter", f"arn:aws:ssm:us-west-2::parameter{r.params['HeadNodeAmi']}", {})], False),
        ("images: read another of the account's parameters", "ImagesRole", [("ssm:GetParameter", f"{own}/db/password", {})], False),
        ("images: change an image's parameter", "ImagesRole",
         [("ssm:PutParameter", f"{own}{r.params['HeadNodeAmi']}", {}), ("ssm:PutParameter", f"{ssm}::parameter{r.params['HeadNodeAmi']}", {})], False),
        ("images: read the munge key", "ImagesRole", [("secretsmanager:GetSecretValue", secret, {})], False),
        ("images: launch", "ImagesRole", launch(ups[0]), False),
    ]
    for p in ("HeadNodeAmi", "ComputeAmi"):
        if not r.params[p].startswith(("/aws/service/", "ami-")):
            out.append((f"images: resolve the account's own {p}", "ImagesRole", [("ssm:GetParameter", f"{own}{r.params[p]}", {})], True))
    if r.exists("MountTargetRole"):
        out += mount_target_cases(r, secret, launch(ups[0]))
    for role in ("HeadNodeRole", "ComputeRole", "CleanupRole", "ImagesRole") + (("MountTargetRole",) if r.exists("MountTargetRole") else ()):
        out.append((f"{role}: ship logs", role, [("logs:CreateLogStream", log_stream, {}), ("logs:PutLogEvents", log_stream, {})], True))
        out.append((f"{role}: logs elsewhere", role, [("logs:PutLogEvents", other_stream, {})], False))
        out.append((f"{role}: delete the log group", role, [("logs:DeleteLogGroup", r.attribute("LogGroup", "Arn"), {})], False))
    out += [("head node: read the munge key", "HeadNodeRole", [("secretsmanager:GetSecretValue", secret, {})], True),
            # (the head node serves it: a compute node's credentials, if a job got them, forge nothing)
            ("compute: read the munge key", "ComputeRole", [("secretsmanager:GetSecretValue", secret, {})], False)]
    for role in ("HeadNodeRole", "ComputeRole"):
        out.append((f"{role}: read another secret", role,
                    [("secretsmanager:GetSecretValue", f"arn:aws:secretsmanager:{cfn.REGION}:{cfn.ACCOUNT}:secret:other-AbCdEf", {})], False))
        out.append((f"{role}: change the munge key", role, [("secretsmanager:PutSecretValue", secret, {})], False))
        if r.conditions["HasDataBucket"]:
            bucket = f"arn:aws:s3:::{r.params['DataBucket']}"
            # (the data is the data role's, which jobs get: a node's own role reads none of it)
            out.append((f"{role}: read the data", role, [("s3:GetObject", f"{bucket}/cifar10/a", {})], False))
    if r.conditions["HasDataBucket"]:
        bucket = f"arn:aws:s3:::{r.params['DataBucket']}"
        data_role = r.attribute("DataRole", "Arn")
        out += [("compute: take the data role", "ComputeRole", [("sts:AssumeRole", data_role, {})], True),
                ("compute: tag its data-role session", "ComputeRole", [("sts:TagSession", data_role, {})], False),
                ("compute: take another role", "ComputeRole", [("sts:AssumeRole", r.attribute("HeadNodeRole", "Arn"), {})], False),
                ("head node: take the data role", "HeadNodeRole", [("sts:AssumeRole", data_role, {})], False),
                ("data: read the munge key", "DataRole", [("secretsmanager:GetSecretValue", secret, {})], False),
                ("data: launch", "DataRole", launch(ups[0]), False),
                ("data: ship logs", "DataRole", [("logs:PutLogEvents", log_stream, {})], False),
                ("data: take a role", "DataRole", [("sts:AssumeRole", data_role, {})], False)]
        role = "DataRole"
        out += [(f"{role}: read the data", role, [("s3:ListBucket", bucket, {}), ("s3:GetObject", f"{bucket}/cifar10/a", {})], True),
                (f"{role}: write a result", role, [("s3:PutObject", f"{bucket}/results/run1/x", {})], True),
                (f"{role}: write outside the results prefix", role, [("s3:PutObject", f"{bucket}/cifar10/a", {})], False),
                (f"{role}: delete data", role, [("s3:DeleteObject", f"{bucket}/cifar10/a", {})], False),
                (f"{role}: delete a result", role, [("s3:DeleteObject", f"{bucket}/results/run1/x", {})], False),
                (f"{role}: change the bucket's policy", role, [("s3:PutBucketPolicy", bucket, {})], False),
                (f"{role}: read another bucket", role, [("s3:GetObject", "arn:aws:s3:::other/a", {})], False),
                (f"{role}: list another bucket", role, [("s3:ListBucket", "arn:aws:s3:::other", {})], False)]
    return out


def mount_target_cases(r, secret, launch):
    """HeadNodeZoneMountTarget's function, in an existing VPC: a mount target of the cluster's file
    system in the head node's subnet made, watched and deleted, with its network interface (EFS
    makes and deletes that with the caller's permissions); nothing else."""
    role = "MountTargetRole"
    fs = r.physical("SharedFileSystem" if r.exists("SharedFileSystem") else "DisposableSharedFileSystem")
    efs = f"arn:aws:elasticfilesystem:{cfn.REGION}:{cfn.ACCOUNT}"
    subnet, other_subnet = f"{ARN}:subnet/{r.params['PublicSubnetId']}", f"{ARN}:subnet/subnet-0ffffffffffffffff"
    group, eni = f"{ARN}:security-group/{r.physical('StorageSecurityGroup')}", f"{ARN}:network-interface/eni-0123456789abcdef0"
    made = [("ec2:DescribeSubnets", "*", {}), ("elasticfilesystem:CreateMountTarget", f"{efs}:file-system/{fs}", {}),
            ("ec2:DescribeNetworkInterfaces", "*", {}),
            ("ec2:CreateNetworkInterface", subnet, {}), ("ec2:CreateNetworkInterface", group, {}),
            ("ec2:CreateNetworkInterface", eni, {"ec2:Subnet": subnet}),
            ("elasticfilesystem:DescribeMountTargets", f"{efs}:file-system/{fs}", {})]
    deleted = [("elasticfilesystem:DeleteMountTarget", f"{efs}:file-system/{fs}", {}),
               ("ec2:DeleteNetworkInterface", eni, {"ec2:Subnet": subnet})]
    return [
        ("mount target: make one in the head node's subnet", role, made, True),
        ("mount target: delete it", role, deleted, True),
        ("mount target: make one for another file system", role,
         [("elasticfilesystem:CreateMountTarget", f"{efs}:file-system/fs-0ffffffffffffffff", {})], False),
        ("mount target: delete another file system's", role,
         [("elasticfilesystem:DeleteMountTarget", f"{efs}:file-system/fs-0ffffffffffffffff", {})], False),
        ("mount target: delete the file system", role, [("elasticfilesystem:DeleteFileSystem", f"{efs}:file-system/{fs}", {})], False),
        ("mount target: change the file system's policy", role,
         [("elasticfilesystem:PutFileSystemPolicy", f"{efs}:file-system/{fs}", {})], False),
        ("mount target: a network interface in another subnet", role, [("ec2:CreateNetworkInterface", other_subnet, {})], False),
        ("mount target: a network interface in another security group", role,
         [("ec2:CreateNetworkInterface", f"{ARN}:security-group/sg-0ffffffffffffffff", {})], False),
        ("mount target: delete the head node's subnet", role, [("ec2:DeleteSubnet", subnet, {})], False),
        ("mount target: delete a network interface in another subnet", role,
         [("ec2:DeleteNetworkInterface", eni, {"ec2:Subnet": other_subnet})], False),
        ("mount target: read the munge key", role, [("secretsmanager:GetSecretValue", secret, {})], False),
        ("mount target: launch", role, launch, False),
    ]


def failures(r, policies):
    """The cases whose outcome under `policies` is not the expected one."""
    bad = []
    for keys, (what, role, checks, expected) in ((k, c) for k in KEY_SOURCES for c in cases(r, k)):
        what = f"{what} (condition keys: {keys})"
        statements = policies.get(role, [])
        got = all(allowed(statements, *check) for check in checks)
        if expected and not got:
            refused = [c[:2] for c in checks if not allowed(statements, *c)]
            bad.append(f"{what}: refused {refused}")
        elif not expected and got:
            bad.append(f"{what}: allowed")
    return bad


def mutations(statement):
    """(description, mutated statement): each condition removed, the resource widened, and the
    action widened where no condition confines it (a condition on a key only its own action has,
    such as ec2:CreateAction or iam:PassedToService, already does)."""
    for op, keys in statement.get("Condition", {}).items():
        for key in keys:
            m = copy.deepcopy(statement)
            del m["Condition"][op][key]
            if not m["Condition"][op]:
                del m["Condition"][op]
            yield f"without its {op} {key} condition", m
    if "Resource" in statement and listify(statement["Resource"]) != ["*"]:
        yield "with Resource *", {**copy.deepcopy(statement), "Resource": "*"}
    services = sorted({a.split(":")[0] for a in listify(statement["Action"])})
    widened = [f"{s}:*" for s in services]
    if sorted(listify(statement["Action"])) != widened and not statement.get("Condition"):
        yield f"with Action {widened}", {**copy.deepcopy(statement), "Action": widened}


class Policies(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.template = cfn.load_template()

    def test_the_cluster_may_do_what_it_does_and_nothing_else(self):
        for name, params in (("defaults", {}), ("spot, EFA, two types, data", FULL),
                             ("an existing VPC", {"VpcId": "vpc-0a", "PublicSubnetId": "subnet-0a", "PrivateSubnetId": "subnet-0b"}),
                             ("the account's own image parameters", {"HeadNodeAmi": "/images/head", "ComputeAmi": "/images/gpu"})):
            with self.subTest(name):
                r = cfn.Resolved(self.template, **params)
                self.assertEqual(failures(r, r.role_policies()), [])

    def test_a_power_up_may_go_into_each_compute_subnet_and_no_other(self):
        """Every compute subnet in every zone (a new VPC's ComputeZones, or an existing VPC's list)
        is in cloud.json, in order, and a power-up into each is allowed; one into another subnet,
        even a subnet of the same VPC (the head node's), is refused (cases(): another subnet)."""
        existing = {"VpcId": "vpc-0a", "PublicSubnetId": "subnet-0a"}
        no_efa = {**FULL, "UseEfa": "false"}
        for name, params, subnets in (
                ("a new VPC, 1 zone", {"ComputeZones": "1"}, ["PrivateSubnet"]),
                ("a new VPC, the default", {}, ["PrivateSubnet", "PrivateSubnet2"]),
                ("a new VPC, 3 zones", {**no_efa, "ComputeZones": "3"}, ["PrivateSubnet", "PrivateSubnet2", "PrivateSubnet3"]),
                ("an existing VPC, 1 subnet", {**existing, "PrivateSubnetId": "subnet-0b"}, ["subnet-0b"]),
                ("an existing VPC, 2 subnets", {**existing, "PrivateSubnetId": "subnet-0b,subnet-0c"}, ["subnet-0b", "subnet-0c"]),
                ("an existing VPC, 3 subnets", {**existing, **no_efa, "PrivateSubnetId": "subnet-0b,subnet-0c,subnet-0d"},
                 ["subnet-0b", "subnet-0c", "subnet-0d"]),
                # EFA: the power-ups go into the first, the placement group's zone (resume.py)
                ("an existing VPC, 3 subnets, EFA", {**existing, **FULL, "PrivateSubnetId": "subnet-0b,subnet-0c,subnet-0d"},
                 ["subnet-0b", "subnet-0c", "subnet-0d"])):
            with self.subTest(name):
                r = cfn.Resolved(self.template, **params)
                want = [s if s.startswith("subnet-0") else r.physical(s) for s in subnets]
                self.assertEqual(head_node_config(r)["subnet_ids"], want)
                ups = power_ups(r)
                used = want[:1] if params.get("UseEfa") == "true" else want
                self.assertEqual(sorted({u["NetworkInterfaces"][0]["SubnetId"] for u in ups}), sorted(used))
                self.assertEqual(failures(r, r.role_policies()), [])
                policies = r.role_policies()["HeadNodeRole"]
                for subnet in want + ["subnet-0other", r.physical("PublicSubnet") if r.conditions["CreateVpc"] else "subnet-0a"]:
                    self.assertEqual(allowed(policies, "ec2:RunInstances", f"{ARN}:subnet/{subnet}",
                                             {"ec2:LaunchTemplate": f"{ARN}:launch-template/{r.physical('ComputeLaunchTemplate')}",
                                              "ec2:IsLaunchTemplateResource": "false"}), subnet in want, subnet)

    def test_the_power_up_tags_every_resource_it_creates(self):
        r = cfn.Resolved(self.template, **FULL)
        for req in power_ups(r):
            kinds = {c[1].split(":")[-1].split("/")[0] for c in run_instances_checks(r, req) if c[0] == "ec2:CreateTags"}
            spot = "InstanceMarketOptions" in req
            self.assertEqual(kinds, {"instance", "volume", "network-interface"} | ({"spot-instances-request"} if spot else set()))

    def test_every_statement_is_checked(self):
        """Each planted mutation of each statement makes a case fail (an existing VPC's mount
        target role, there alone, in a second pass)."""
        self.every_statement_is_checked(FULL, ROLES, 40)
        self.every_statement_is_checked({**FULL, "VpcId": "vpc-0a", "PublicSubnetId": "subnet-0a", "PrivateSubnetId": "subnet-0b"},
                                        ROLES + ("MountTargetRole",), 6, only=("MountTargetRole",))

    def every_statement_is_checked(self, params, roles, at_least, only=None):
        r = cfn.Resolved(self.template, **params)
        policies = r.role_policies()
        self.assertEqual(sorted(policies), sorted(roles))
        uncaught, tried = [], 0
        for role in only or roles:
            for i, statement in enumerate(policies[role]):
                for what, mutated in mutations(statement):
                    planted = copy.deepcopy(policies)
                    planted[role][i] = mutated
                    tried += 1
                    if not failures(r, planted):
                        uncaught.append(f"{role} {statement.get('Sid', i)} {what}")
        self.assertEqual(uncaught, [], "\n".join(uncaught))
        self.assertGreater(tried, at_least)

    def test_only_the_compute_role_may_take_the_data_role(self):
        """The data role's trust: the compute role (whose root service hands its credentials to
        jobs), no one else."""
        r = cfn.Resolved(self.template, **FULL)
        trust = r.resource("DataRole")["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        self.assertEqual(trust, [{"Effect": "Allow", "Principal": {"AWS": r.attribute("ComputeRole", "Arn")},
                                  "Action": "sts:AssumeRole"}])
        self.assertFalse(cfn.Resolved(self.template).exists("DataRole"))

    def test_the_evaluator_knows_tag_on_create(self):
        """The evaluator itself: a request tag condition fails on a resource the request does not
        tag, ForAllValues holds on no keys, Null tells a missing key."""
        st = {"Effect": "Allow", "Action": "ec2:RunInstances", "Resource": "arn:x:volume/*",
              "Condition": {"StringEquals": {"aws:RequestTag/k": "v"}}}
        self.assertTrue(allowed([st], "ec2:RunInstances", "arn:x:volume/*", {"aws:RequestTag/k": "v"}))
        self.assertFalse(allowed([st], "ec2:RunInstances", "arn:x:volume/*", {}))
        self.assertTrue(condition_holds("ForAllValues:StringEquals", "aws:TagKeys", ["a"], {}))
        self.assertFalse(condition_holds("ForAllValues:StringEquals", "aws:TagKeys", ["a"], {"aws:TagKeys": ["a", "b"]}))
        self.assertTrue(condition_holds("Null", "k", "false", {"k": "x"}))
        self.assertFalse(condition_holds("Null", "k", "false", {}))
        deny = {**st, "Effect": "Deny", "Condition": {}}
        self.assertFalse(allowed([st, deny], "ec2:RunInstances", "arn:x:volume/*", {"aws:RequestTag/k": "v"}))


# ------------------------------------------------------------------------- the file system's policy
def file_system_policies(r):
    """{file system logical id: statements} of the EFS file systems the template holds (both,
    whichever SharedStorageDeletionPolicy makes: they must be the same)."""
    return {k: r.value(copy.deepcopy(v["Properties"]["FileSystemPolicy"]))["Statement"]
            for k, v in r.template["Resources"].items() if v["Type"] == "AWS::EFS::FileSystem"}


def file_system_cases(r):
    """(what, principal, [(action, context)], whether allowed): an NFS client's requests to the
    file system as efs-utils sends them (tls: aws:SecureTransport true; iam: the role's
    credentials, or none without it)."""
    head, compute = r.attribute("HeadNodeRole", "Arn"), r.attribute("ComputeRole", "Arn")
    other = f"arn:aws:iam::{cfn.ACCOUNT}:role/{cfn.STACK}-SomeoneElse-X1"
    tls, plain = {"aws:SecureTransport": "true"}, {"aws:SecureTransport": "false"}
    mount = ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"]
    return [
        ("head node: mount, write and root over TLS", head, [(a, tls) for a in mount + ["elasticfilesystem:ClientRootAccess"]], True),
        ("compute node: mount and write over TLS", compute, [(a, tls) for a in mount], True),
        ("compute node: root (squashed instead)", compute, [("elasticfilesystem:ClientRootAccess", tls)], False),
        ("head node: mount without TLS", head, [("elasticfilesystem:ClientMount", plain)], False),
        ("compute node: mount without TLS", compute, [("elasticfilesystem:ClientMount", plain)], False),
        ("compute node: write without TLS", compute, [("elasticfilesystem:ClientWrite", plain)], False),
        ("another role: mount over TLS", other, [("elasticfilesystem:ClientMount", tls)], False),
        ("another role: root over TLS", other, [("elasticfilesystem:ClientRootAccess", tls)], False),
        ("a client without IAM (anonymous): mount over TLS", None, [("elasticfilesystem:ClientMount", tls)], False),
        ("head node: delete the file system", head, [("elasticfilesystem:DeleteFileSystem", tls)], False),
        ("compute node: change the file system's policy", compute, [("elasticfilesystem:PutFileSystemPolicy", tls)], False),
    ]


def file_system_failures(r, statements):
    bad = []
    for what, principal, requests, expected in file_system_cases(r):
        got = all(allowed(statements, action, "", ctx, principal) for action, ctx in requests)
        if got != expected:
            bad.append(f"{what}: {'allowed' if got else 'refused'}")
    return bad


def file_system_mutations(statement):
    """mutations() and, for a resource policy, the statement gone and its principal widened."""
    yield "removed", None
    yield from mutations(statement)
    if statement.get("Principal") not in ("*", {"AWS": "*"}):
        yield "with Principal *", {**copy.deepcopy(statement), "Principal": {"AWS": "*"}}


class FileSystemPolicy(unittest.TestCase):
    """The EFS file system's policy, evaluated as a resource policy (principal, aws:SecureTransport)."""

    @classmethod
    def setUpClass(cls):
        cls.template = cfn.load_template()

    def test_both_file_systems_have_the_same_policy_and_backups(self):
        r = cfn.Resolved(self.template)
        found = file_system_policies(r)
        self.assertEqual(sorted(found), ["DisposableSharedFileSystem", "SharedFileSystem"])
        self.assertEqual(found["SharedFileSystem"], found["DisposableSharedFileSystem"])
        for logical in found:
            self.assertEqual(r.resource(logical)["Properties"]["BackupPolicy"], {"Status": "ENABLED"}, logical)

    def test_only_the_nodes_roles_over_tls_and_root_on_the_head_only(self):
        for name, params in (("defaults", {}), ("deleted with the stack", {"SharedStorageDeletionPolicy": "Delete"})):
            with self.subTest(name):
                r = cfn.Resolved(self.template, **params)
                for logical, statements in file_system_policies(r).items():
                    self.assertEqual(file_system_failures(r, statements), [], logical)

    def test_every_statement_is_checked(self):
        """Each statement removed, each condition removed, the action widened, the principal
        widened: each makes a case fail."""
        r = cfn.Resolved(self.template)
        statements = file_system_policies(r)["SharedFileSystem"]
        uncaught, tried = [], 0
        for i, statement in enumerate(statements):
            for what, mutated in file_system_mutations(statement):
                planted = [s for j, s in enumerate(statements) if j != i] + ([mutated] if mutated else [])
                tried += 1
                if not file_system_failures(r, planted):
                    uncaught.append(f"{statement.get('Sid', i)} {what}")
        self.assertEqual(uncaught, [], "\n".join(uncaught))
        self.assertGreaterEqual(tried, 8)

    def test_the_evaluator_knows_principals_and_secure_transport(self):
        role = f"arn:aws:iam::{cfn.ACCOUNT}:role/a"
        st = {"Effect": "Allow", "Principal": {"AWS": [role]}, "Action": "elasticfilesystem:ClientMount"}
        deny = {"Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
        self.assertTrue(allowed([st, deny], "elasticfilesystem:ClientMount", "", {"aws:SecureTransport": "true"}, role))
        self.assertFalse(allowed([st, deny], "elasticfilesystem:ClientMount", "", {"aws:SecureTransport": "false"}, role))
        self.assertFalse(allowed([st], "elasticfilesystem:ClientMount", "", {}, role + "b"))
        self.assertFalse(allowed([st], "elasticfilesystem:ClientMount", "", {}, None))
        self.assertTrue(allowed([{**st, "Principal": "*"}], "elasticfilesystem:ClientMount", "", {}, None))


if __name__ == "__main__":
    unittest.main()
