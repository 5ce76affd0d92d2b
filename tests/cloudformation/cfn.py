"""What the AWS tests share about cloudformation/cluster.yaml: the template parsed (cfn-lint's
decoder), its intrinsic functions resolved for given parameters (with made-up physical ids, as
CloudFormation would give real ones), the cleanup handler's inline code loaded as a module, and
moto made to run that custom resource in-process (moto runs Lambda only in a container)."""

import contextlib
import copy
import functools
import hashlib
import json
import os
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "..", "cloudformation", "cluster.yaml")
NODE_DIR = os.path.join(HERE, "..", "..", "cloudformation", "node")

REGION = "us-east-1"
ACCOUNT = "123456789012"
STACK = "hpc"
NO_VALUE = object()


# moto's catalog of Amazon's images: 1,177 of them in moto 5.2, which it takes 1.3 to 3 s to
# serialise for one unfiltered DescribeImages; the AWS tests want one or two image ids.
AMAZON_LINUX_2 = [{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}]


def amazon_images(ec2, count=1):
    """The ids of `count` of the Amazon images an EC2 client (moto's) knows: a few Amazon Linux 2
    ones, or any Amazon image where moto's catalog has none of those."""
    images = ec2.describe_images(Owners=["amazon"], Filters=AMAZON_LINUX_2)["Images"]
    if len(images) < count:
        images = ec2.describe_images(Owners=["amazon"])["Images"]
    if len(images) < count:
        raise AssertionError(f"moto knows {len(images)} Amazon images, not {count}")
    return [i["ImageId"] for i in images[:count]]


@functools.lru_cache(maxsize=None)
def load_template(path=TEMPLATE):
    """The parsed template (cluster.yaml unless told; parsed once: shared, not to be changed)."""
    from cfnlint.decode import decode

    template, matches = decode(path)
    if matches:
        raise ValueError(f"{path}: {matches}")
    return template


def lint(path):
    """(exit code, output) of cfn-lint on the template at `path`."""
    r = subprocess.run([sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())", path],
                       capture_output=True, text=True, check=False)
    return r.returncode, r.stdout + r.stderr


def default_parameters(template):
    return {name: p.get("Default", "") for name, p in template["Parameters"].items()}


class Resolved:
    """The template with its parameters given: conditions, and any value resolved."""

    def __init__(self, template, custom=None, ssm=None, **params):
        """`custom`: {logical id: {attribute: value}} of custom resources (default: made-up images);
        `ssm`: name -> value, for parameters of an AWS::SSM::Parameter::Value type (CloudFormation
        reads them at each create and update)."""
        self.template = template
        self.custom = custom or {"Images": {"HeadNodeImage": "ami-0aaaaaaaaaaaaaaa1", "ComputeImage": "ami-0ccccccccccccccc1"}}
        self.params = default_parameters(template)
        self.params.update(KeyName="mykey", **params)
        for name, p in template["Parameters"].items():
            if p["Type"] == "CommaDelimitedList" and isinstance(self.params[name], str):
                self.params[name] = self.params[name].split(",")
            if p["Type"].startswith("AWS::SSM::Parameter::Value") and ssm:
                self.params[name] = ssm(self.params[name])
        self.pseudo = {"AWS::StackName": STACK, "AWS::Region": REGION, "AWS::AccountId": ACCOUNT,
                       "AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com",
                       "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK}/0f0e0d0c-uuid"}
        self.conditions = {}
        for name, expr in template["Conditions"].items():
            self.conditions[name] = self.value(expr)

    def exists(self, logical):
        cond = self.template["Resources"][logical].get("Condition")
        return cond is None or self.conditions[cond]

    def physical(self, logical):
        """A made-up physical id (what Ref gives) for a resource, by type."""
        kind = self.template["Resources"][logical]["Type"]
        tag = hashlib.sha256(logical.encode()).hexdigest()[:17]
        if kind == "AWS::Logs::LogGroup":
            return self.value(self.template["Resources"][logical]["Properties"]["LogGroupName"])
        if kind == "AWS::SecretsManager::Secret":
            return f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{STACK}-{logical}-AbCdEf"
        prefixes = {"AWS::EC2::LaunchTemplate": "lt-", "AWS::EC2::Subnet": "subnet-", "AWS::EC2::VPC": "vpc-",
                    "AWS::EC2::SecurityGroup": "sg-", "AWS::EFS::FileSystem": "fs-", "AWS::EC2::Instance": "i-"}
        return prefixes.get(kind, f"{STACK}-{logical}-") + tag

    def attribute(self, logical, attr):
        kind = self.template["Resources"][logical]["Type"]
        if kind.startswith("Custom::"):
            return self.custom[logical][attr]
        if attr == "Arn" and kind == "AWS::IAM::Role":
            return f"arn:aws:iam::{ACCOUNT}:role/{STACK}-{logical}-X1"
        if attr == "Arn" and kind == "AWS::IAM::InstanceProfile":
            return f"arn:aws:iam::{ACCOUNT}:instance-profile/{STACK}-{logical}-X1"
        if attr == "Arn" and kind == "AWS::Logs::LogGroup":
            return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{self.physical(logical)}:*"
        if attr == "Arn" and kind == "AWS::Lambda::Function":
            return f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{self.physical(logical)}"
        if attr == "GroupId":
            return self.physical(logical)
        if attr in ("PublicIp", "PrivateIp"):
            return "203.0.113.10"
        if attr == "AllocationId":
            return "eipalloc-0"
        raise KeyError(f"{logical}.{attr}")

    def ref(self, name):
        if name in self.pseudo:
            return self.pseudo[name]
        if name == "AWS::NoValue":
            return NO_VALUE
        if name in self.params:
            return self.params[name]
        return self.physical(name)

    def sub(self, text, variables):
        out, i = [], 0
        while i < len(text):
            j = text.find("${", i)
            if j < 0:
                out.append(text[i:])
                break
            out.append(text[i:j])
            k = text.index("}", j)
            name = text[j + 2:k]
            if name.startswith("!"):
                out.append("${" + name[1:] + "}")
            elif name in variables:
                out.append(str(self.value(variables[name])))
            elif "." in name and not name.startswith("AWS::"):
                out.append(str(self.attribute(*name.split(".", 1))))
            else:
                value = self.ref(name)
                out.append(",".join(value) if isinstance(value, list) else str(value))
            i = k + 1
        return "".join(out)

    def value(self, v):
        """`v` with every intrinsic function resolved and AWS::NoValue dropped."""
        if isinstance(v, list):
            return [x for x in (self.value(x) for x in v) if x is not NO_VALUE]
        if not isinstance(v, dict):
            return v
        if len(v) == 1:
            (fn, arg), = v.items()
            if fn == "Ref":
                return self.ref(arg)
            if fn == "Fn::Sub":
                return self.sub(arg, {}) if isinstance(arg, str) else self.sub(arg[0], arg[1])
            if fn == "Fn::GetAtt":
                return self.attribute(*(arg.split(".", 1) if isinstance(arg, str) else arg))
            if fn == "Fn::If":
                return self.value(arg[1] if self.conditions[arg[0]] else arg[2])
            if fn == "Fn::Join":
                return arg[0].join(str(x) for x in self.value(arg[1]))
            if fn == "Fn::Select":
                return self.value(arg[1])[int(self.value(arg[0]))]
            if fn == "Fn::GetAZs":
                return [f"{REGION}a", f"{REGION}b", f"{REGION}c"]
            if fn == "Fn::Split":
                return str(self.value(arg[1])).split(arg[0])
            if fn == "Fn::EachMemberIn":  # (a Rules function)
                members, allowed = (self.value(x) for x in arg)
                return all(m in allowed for m in members)
            if fn == "Fn::Base64":
                return self.value(arg)
            if fn == "Fn::FindInMap":
                a, b, c = (self.value(x) for x in arg)
                return self.template["Mappings"][a][b][c]
            if fn == "Fn::Equals":
                a, b = (self.value(x) for x in arg)
                return a == b if isinstance(a, list) or isinstance(b, list) else str(a) == str(b)
            if fn == "Fn::Not":
                return not self.value(arg[0])
            if fn == "Fn::And":
                return all(self.value(x) for x in arg)
            if fn == "Fn::Or":
                return any(self.value(x) for x in arg)
            if fn == "Condition":
                return self.conditions[arg]
        out = {}
        for k, x in v.items():
            x = self.value(x)
            if x is not NO_VALUE:
                out[k] = x
        return out

    def resource(self, logical):
        return self.value(copy.deepcopy(self.template["Resources"][logical]))

    def role_policies(self):
        """{role logical id: [statement]} of every policy the stack attaches to each role."""
        found = {}
        for logical, res in self.template["Resources"].items():
            if not self.exists(logical):
                continue
            if res["Type"] == "AWS::IAM::Role":
                for policy in self.value(res["Properties"].get("Policies", [])):
                    found.setdefault(logical, []).extend(policy["PolicyDocument"]["Statement"])
            elif res["Type"] == "AWS::IAM::Policy":
                props = self.value(res["Properties"])
                for role in res["Properties"]["Roles"]:
                    found.setdefault(role["Ref"], []).extend(props["PolicyDocument"]["Statement"])
        return found


def function_module(template, logical, sent):
    """The inline code of the Lambda function `logical` as a module, its cfnresponse a fake that
    appends (status, physical id, reason, event, data) to `sent`."""
    fake = types.ModuleType("cfnresponse")
    fake.SUCCESS, fake.FAILED = "SUCCESS", "FAILED"
    fake.send = lambda event, context, status, data, physical=None, noEcho=False, reason=None: \
        sent.append((status, physical, reason, event, data))
    module = types.ModuleType(f"{logical}_handler")
    code = template["Resources"][logical]["Properties"]["Code"]["ZipFile"]
    saved = sys.modules.get("cfnresponse")
    sys.modules["cfnresponse"] = fake
    try:
        exec(compile(code, f"cluster.yaml:{logical}", "exec"), module.__dict__)  # noqa: S102 - the code under test
    finally:
        if saved is None:
            del sys.modules["cfnresponse"]
        else:
            sys.modules["cfnresponse"] = saved
    return module


def cleanup_module(template, sent):
    return function_module(template, "CleanupFunction", sent)


def inline_functions(template):
    """The logical ids of the template's Lambda functions with inline code."""
    return [k for k, v in template["Resources"].items()
            if v["Type"] == "AWS::Lambda::Function" and "ZipFile" in v["Properties"].get("Code", {})]


class LambdaContext:
    def __init__(self, seconds=900):
        self.deadline = seconds

    def get_remaining_time_in_millis(self):
        return self.deadline * 1000


class CustomResources:
    """The answers the stack's custom resources gave (status, physical id, reason, event, data)."""

    def __init__(self):
        self.answers = []

    def deliver(self):
        """Raises if a custom resource answered FAILED (its data reached moto's stack already)."""
        failed = [(a[3]["LogicalResourceId"], a[2]) for a in self.answers if a[0] != "SUCCESS"]
        if failed:
            raise AssertionError(f"custom resources failed: {failed}")


class _RunNow:
    """threading.Thread for moto's custom resources: runs the target at start(), so that the
    resource's answer (and data, for !GetAtt) is there before moto creates what depends on it, as
    CloudFormation waits for it."""

    def __init__(self, target, args=(), **_):
        self.target, self.args = target, args

    def start(self):
        self.target(*self.args)


@contextlib.contextmanager
def moto_runs_custom_resources(template):
    """moto's CloudFormation hands a custom resource to its Lambda, which moto runs only in a
    container and on a thread of its own, without waiting: here the function's own inline code
    runs in-process, at once, and its answer reaches moto's stack as CloudFormation's response
    URL would take it."""
    from moto.awslambda.models import LambdaFunction
    from moto.cloudformation import custom_model
    from moto.cloudformation.models import cloudformation_backends

    pending = CustomResources()

    def invoke(self, body, request_headers, response_headers):
        sent = []
        # (moto names a stack's function STACK-LOGICAL-SUFFIX)
        logical = next(f for f in inline_functions(template) if f"-{f}-" in self.function_name)
        function_module(template, logical, sent).handler(json.loads(body), LambdaContext())
        for status, _, _, event, data in sent:
            if status == "SUCCESS":
                stack = cloudformation_backends[ACCOUNT][REGION].get_stack(event["StackId"])
                stack.get_custom_resource(event["LogicalResourceId"]).set_data(data)
        pending.answers += sent
        return "null"

    real = LambdaFunction.invoke
    LambdaFunction.invoke = invoke
    real_threading = custom_model.threading
    custom_model.threading = types.SimpleNamespace(Thread=_RunNow)
    try:
        yield pending
    finally:
        LambdaFunction.invoke = real
        custom_model.threading = real_threading


@contextlib.contextmanager
def moto_keeps_what_it_cannot_update():
    """moto's stack update drops a changed resource whose type it cannot update (an EC2 instance:
    its update is not implemented), which breaks every later !GetAtt of it; CloudFormation would
    update it in place or replace it. Here moto keeps it as it was: what CloudFormation would do
    to it is the test's to work out (template_test.instance_update)."""
    from moto.cloudformation import parsing

    real = parsing.parse_and_update_resource

    def update(logical_id, resource_json, resources_map, account_id, region_name):
        changed = real(logical_id, resource_json, resources_map, account_id, region_name)
        return resources_map[logical_id] if changed is None else changed

    parsing.parse_and_update_resource = update
    try:
        yield
    finally:
        parsing.parse_and_update_resource = real
