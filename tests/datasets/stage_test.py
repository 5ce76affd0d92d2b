"""hpcdata stage against moto's S3 served on loopback, through the real AWS CLI: two concurrent
stagings of one prefix into one DEST download each object once; a staging killed part-way
resumes and completes, fetching again only what it had not finished; what is staged is
verified; no lock file stays, however a staging ends; files hpcdata did not stage are kept (and
named) unless --delete. Bad input is one error line with the documented exit code, and changes
nothing: a malformed bucket or DEST (the root directory included) is refused before DEST is
touched, and the copy never starts in a directory holding someone's files. A DEST another user
owns or could write into is refused, and the lock file is never opened through a link."""

import datetime
import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

from tree_snapshot import snapshot

HERE = os.path.dirname(os.path.abspath(__file__))
HPCDATA = os.path.join(HERE, "..", "..", "datasets", "hpcdata")

MISSING = [tool for tool in ("aws", "moto_server") if not shutil.which(tool)]


def moto_server_fails():
    """Why moto_server, on PATH, cannot start ("" when it can): moto installed without its
    `server` extra (Flask; `moto[all]` leaves it out) fails on import, which a test would
    otherwise take for a failure of its own after waiting for the server."""
    try:
        run = subprocess.run(["moto_server", "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if run.returncode == 0:
        return ""
    lines = (run.stderr or run.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit code {run.returncode}"

GET_OBJECT = re.compile(r'"GET /(?P<bucket>[^/?\s]+)/(?P<key>[^?\s]+) HTTP')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stand_in_aws(tmp, body):
    """An environment whose PATH finds an `aws` in TMP/bin that runs the shell `body` (for the
    tests that need no AWS CLI and no moto)."""
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "aws"), "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(os.path.join(bin_dir, "aws"), 0o755)
    return dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))


class BucketNames(unittest.TestCase):
    """A malformed bucket is a usage error refused before anything is touched: no AWS CLI call,
    no DEST made (runs without the AWS CLI and moto: a stand-in `aws` notes any call)."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hpcdata-buckets-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.calls = os.path.join(self.tmp, "aws-calls")
        self.env = stand_in_aws(self.tmp, f'echo "$*" >> {self.calls}\necho "aws: no service here" >&2\nexit 255\n')
        self.dest = os.path.join(self.tmp, "dest")

    def stage(self, url):
        p = subprocess.run([sys.executable, HPCDATA, "stage", url, self.dest], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=self.env, timeout=60)
        return p.returncode, p.stderr

    def test_malformed_bucket_is_refused_before_the_cli(self):
        for bucket, rule in [("-bad", "begin and end with a letter or digit"),
                             ("bad-", "begin and end with a letter or digit"),
                             (".bad", "begin and end with a letter or digit"),
                             ("a", "3 to 63 characters"), ("ab", "3 to 63 characters"),
                             ("a" * 256, "3 to 63 characters, or up to 255"),
                             ("bad..name", "no two dots in a row"),
                             ("bad_bucket!", "letters, digits, '.', '-' and '_' only"),
                             ("da ta", "letters, digits, '.', '-' and '_' only"),
                             ("caf\u00e9", "letters, digits, '.', '-' and '_' only"),
                             ("192.168.5.4", "formatted as an IP address")]:
            with self.subTest(bucket=bucket):
                code, err = self.stage(f"s3://{bucket}/x")
                self.assertEqual(code, 2, err)
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertTrue(err.startswith(f"hpcdata: error: 's3://{bucket}/x': '{bucket}' is not a bucket name ("),
                                err)
                self.assertIn(rule, err)
                self.assertFalse(os.path.exists(self.calls), "the AWS CLI was run for a malformed bucket")
                self.assertFalse(os.path.exists(self.dest), "DEST was made for a malformed bucket")

    def test_valid_buckets_reach_the_cli(self):
        """Names S3 accepts (access point aliases, directory buckets and us-east-1's oldest, with
        capitals and '_', included) go to the CLI."""
        for bucket in ("abc", "a" * 63, "my.data-1", "1-2.3", "10.0.0.1.data", "data--usw2-az1--x-s3",
                       "my-ap-abc123-s3alias", "Old_Data", "a" * 255):
            with self.subTest(bucket=bucket):
                code, err = self.stage(f"s3://{bucket}/x")
                self.assertEqual(code, 1, err)
                self.assertEqual(err.splitlines(), [f"hpcdata: error: listing s3://{bucket}/x/ failed: aws: no service "
                                                    "here"])
                with open(self.calls) as f:
                    self.assertIn(f"--bucket {bucket} ", f.read())
                os.unlink(self.calls)


class DestOfAnotherUser(unittest.TestCase):
    """A DEST another user could write into is refused before anything in it is read or written
    (a completion marker planted there named the same source and made stage take planted files
    for the staging), and the lock file is never opened through a link (it made the staging
    overwrite the link's target). Runs without the AWS CLI and moto: a stand-in `aws` fails."""

    SOURCE = "s3://data/sets/one"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hpcdata-dest-")
        os.chmod(self.tmp, 0o755)  # (a uid 1001 must reach DEST for the refusal to be about DEST)
        self.addCleanup(shutil.rmtree, self.tmp, True)
        bin_dir = os.path.join(self.tmp, "bin")
        os.makedirs(bin_dir)
        with open(os.path.join(bin_dir, "aws"), "w") as f:
            f.write('#!/bin/sh\necho "aws: no service here" >&2\nexit 255\n')
        os.chmod(os.path.join(bin_dir, "aws"), 0o755)
        self.env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))

    def stage(self, dest, umask=None):
        p = subprocess.run([sys.executable, HPCDATA, "stage", self.SOURCE, dest], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=self.env, timeout=60,
                           preexec_fn=None if umask is None else lambda: os.umask(umask))
        return p.returncode, p.stderr

    def planted(self, owner=None, mode=0o755):
        """A DEST holding a completion marker of SOURCE and a planted file, as its owner left it."""
        dest = os.path.join(self.tmp, "shared-dest")
        os.makedirs(dest)
        with open(os.path.join(dest, "index.bin"), "w") as f:
            f.write("planted")
        with open(os.path.join(dest, ".hpcdata-staged.json"), "w") as f:
            json.dump({"source": self.SOURCE + "/", "objects": 1, "bytes": 7, "files": ["index.bin"]}, f)
        if owner is not None:
            for d, _, names in os.walk(dest):
                for n in [d] + [os.path.join(d, n) for n in names]:
                    os.chown(n, owner, owner)
        os.chmod(dest, mode)
        return dest

    def assert_refused(self, dest, says):
        before = snapshot(dest)
        code, err = self.stage(dest)
        self.assertEqual(code, 2, err)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertTrue(err.startswith(f"hpcdata: error: DEST {dest} "), err)
        self.assertIn(says, err)
        self.assertNotIn("already staged", err)
        self.assertEqual(snapshot(dest), before, "a refused DEST was changed")

    def test_dest_of_another_uid_is_refused(self):
        if os.geteuid() != 0:
            self.skipTest("chown to another uid needs root")
        self.assert_refused(self.planted(owner=1001), "belongs to uid 1001, not you (uid 0), root or one of your groups")

    def test_dest_writable_by_others_is_refused(self):
        self.assert_refused(self.planted(mode=0o1777), "is writable by others (mode 1777)")
        shutil.rmtree(os.path.join(self.tmp, "shared-dest"))
        self.assert_refused(self.planted(mode=0o757), "is writable by others (mode 757)")

    def test_dest_in_a_folder_others_may_write_to_is_refused(self):
        """A DEST, there or to be made, in a folder every user may write to that is not sticky: they
        could rename it away and put a staging of their own in its place. Refused before DEST is
        made or read (no AWS CLI call: the stand-in's failure would be exit 1); a sticky folder (as
        /tmp) or a team's (group write) gets as far as listing."""
        folder = os.path.join(self.tmp, "open")
        os.makedirs(folder)
        os.chmod(folder, 0o777)
        planted = self.planted()
        os.rename(planted, os.path.join(folder, "planted"))
        for dest in (os.path.join(folder, "dest"), os.path.join(folder, "new", "dest"), os.path.join(folder, "planted")):
            before = snapshot(folder)
            code, err = self.stage(dest)
            self.assertEqual(code, 2, err)
            self.assertEqual(err.splitlines(), [f"hpcdata: error: DEST {dest}: {folder} is writable by others (mode "
                                                f"777) and not sticky: another user could rename {dest} away and put "
                                                "a staging of their choosing in its place; use a directory of your own"])
            self.assertEqual(snapshot(folder), before, "a refused DEST was changed")
        for mode in (0o1777, 0o775):
            os.chmod(folder, mode)
            code, err = self.stage(os.path.join(folder, "new", "dest"))
            self.assertEqual(code, 1, err)
            self.assertIn("listing s3://data/sets/one/ failed: aws: no service here", err)

    def test_new_dest_is_private_whatever_the_umask(self):
        """Under umask 002 (Debian's for users with a group of their own) the DEST stage makes is
        still not the group's: it gets as far as listing (the stand-in's failure, exit 1)."""
        dest = os.path.join(self.tmp, "new", "dest")
        code, err = self.stage(dest, umask=0o002)
        self.assertEqual(code, 1, err)
        self.assertIn("listing s3://data/sets/one/ failed: aws: no service here", err)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "new")), "a failed staging left its new DEST")

    def test_lock_file_link_is_not_followed(self):
        dest = os.path.join(self.tmp, "dest")
        os.makedirs(dest)
        target = os.path.join(self.tmp, "precious")
        with open(target, "w") as f:
            f.write("years of work\n")
        os.symlink(target, os.path.join(dest, ".hpcdata-stage.lock"))
        code, err = self.stage(dest)
        with open(target) as f:
            self.assertEqual(f.read(), "years of work\n", "the lock file's link target was written")
        self.assertEqual(code, 2, err)
        self.assertEqual(err.splitlines(), [f"hpcdata: error: {dest}/.hpcdata-stage.lock is a symbolic link: not "
                                            "following it (remove it, or stage into another DEST)"])
        self.assertTrue(os.path.islink(os.path.join(dest, ".hpcdata-stage.lock")))

    def test_lock_file_is_no_other_users_to_open(self):
        """The lock file is never others' to open, whatever the umask: one they may open, if only to
        read, is one they may flock (a user watching DEST held it the moment it was made, and every
        staging into DEST waited, then gave up). The group's as the umask says (a team's jobs share
        a DEST). The stand-in aws records its mode while the staging holds it."""
        dest = os.path.join(self.tmp, "dest")
        os.makedirs(dest)
        record = os.path.join(self.tmp, "lock-mode")
        with open(os.path.join(self.tmp, "bin", "aws"), "w") as f:
            f.write(f'#!/bin/sh\nstat -c %a {dest}/.hpcdata-stage.lock > {record}\nexit 255\n')
        for umask, mode, left in ((0o000, "660", None), (0o022, "640", None), (0o022, "640", 0o644)):
            if left is not None:  # one a killed staging of an earlier hpcdata left
                with open(os.path.join(dest, ".hpcdata-stage.lock"), "w"):
                    pass
                os.chmod(os.path.join(dest, ".hpcdata-stage.lock"), left)
            code, err = self.stage(dest, umask=umask)
            self.assertEqual(code, 1, err)
            with open(record) as f:
                self.assertEqual(f.read().strip(), mode, f"the lock file's mode under umask {umask:03o}, left {left}")

    def test_a_lock_file_whose_mode_cannot_be_set_is_still_taken(self):
        """Making a leftover lock file others' to open no more is hardening, not a condition: on a
        file system that takes no modes (chmod's ENOTSUP, some FUSE mounts) the staging locks as
        before. (Planted: only PermissionError passed over: the OSError ended the staging, its
        descriptor lost.)"""
        import importlib.machinery
        import importlib.util
        from unittest import mock

        loader = importlib.machinery.SourceFileLoader("hpcdata_for_the_lock", HPCDATA)
        hpcdata = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
        loader.exec_module(hpcdata)
        dest = os.path.join(self.tmp, "dest")
        os.makedirs(dest)
        path = os.path.join(dest, ".hpcdata-stage.lock")
        with open(path, "w"):
            pass
        os.chmod(path, 0o644)
        with mock.patch.object(os, "fchmod", side_effect=OSError(errno.ENOTSUP, "Operation not supported")):
            lock = hpcdata.StageLock(dest, 5)
        with lock:
            self.assertTrue(os.path.exists(path))
        self.assertFalse(os.path.exists(path))


class MalformedJson(unittest.TestCase):
    """hpcdata's markers in DEST and the CLI's listing, malformed: nested past what json decodes
    (its RecursionError was a traceback) or not an object (the marker's, an AttributeError) are
    read as the other malformed ones are. Runs without the AWS CLI and moto: a stand-in `aws`
    lists what the test gives it and fails the copy."""

    SOURCE = "s3://data/sets/one"
    NESTED = "[" * 5000 + "]" * 5000

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hpcdata-json-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.listing = os.path.join(self.tmp, "listing.json")
        self.env = stand_in_aws(self.tmp, f'case "$*" in *list-objects-v2*) cat {self.listing}; exit 0;; esac\n'
                                          'echo "aws: no service here" >&2\nexit 255\n')
        self.dest = os.path.join(self.tmp, "dest")
        os.makedirs(self.dest, 0o755)
        self.list_as('{"Contents": [{"Key": "sets/one/a.bin", "Size": 3, "ETag": "\\"x\\""}]}')

    def list_as(self, text):
        with open(self.listing, "w") as f:
            f.write(text)

    def assert_fails(self, says):
        p = subprocess.run([sys.executable, HPCDATA, "stage", self.SOURCE, self.dest], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=self.env, timeout=60)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual([line for line in p.stderr.splitlines() if "error:" in line],
                         [f"hpcdata: error: {says}"], p.stderr)

    def test_markers_nested_too_deeply_or_not_objects_are_malformed(self):
        for marker in (".hpcdata-staged.json", ".hpcdata-staging.json"):
            for text in (self.NESTED, '{"source": "s3://data/sets/one/", "files": ' + self.NESTED + "}", "[1]"):
                with self.subTest(marker=marker, text=text[:20]):
                    with open(os.path.join(self.dest, marker), "w") as f:
                        f.write(text)
                    # Read as no staging: on to the copy, which the stand-in fails.
                    self.assert_fails(f"copying {self.SOURCE}/ failed: aws: no service here")
                    for name in os.listdir(self.dest):
                        os.unlink(os.path.join(self.dest, name))

    def test_listing_nested_too_deeply_is_not_json(self):
        self.list_as('{"Contents": ' + self.NESTED + "}")
        self.assert_fails(f"listing {self.SOURCE}/ returned something that is not JSON")
        self.list_as("[1]")
        self.assert_fails(f"listing {self.SOURCE}/ returned something that is not JSON")


class Stage(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if MISSING:
            raise unittest.SkipTest(f"{MISSING[0]} is not on PATH (the AWS CLI and moto's server are needed)")
        why = moto_server_fails()
        if why:
            raise unittest.SkipTest(f"moto_server cannot start ({why}): install moto with its server extra, "
                                    "'moto[all,server]>=5' (README)")
        cls.tmp = tempfile.mkdtemp(prefix="hpcdata-stage-")
        cls.env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                       AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.path.join(cls.tmp, "aws-config"),
                       AWS_SHARED_CREDENTIALS_FILE=os.path.join(cls.tmp, "no-credentials"))
        # One object at a time, so that a staging can be caught part-way.
        with open(cls.env["AWS_CONFIG_FILE"], "w") as f:
            f.write("[default]\ns3 =\n  max_concurrent_requests = 1\n")
        port = free_port()
        cls.endpoint = f"http://127.0.0.1:{port}"
        cls.server_log_path = os.path.join(cls.tmp, "moto.log")
        cls.server_log = open(cls.server_log_path, "w")
        cls.server = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)], stdout=cls.server_log,
                                      stderr=subprocess.STDOUT, env=cls.env, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(cls.endpoint + "/moto-api/", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or cls.server.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        cls.aws("s3", "mb", "s3://data")
        # The prefix: files of assorted sizes in nested folders, and one big enough to be caught
        # in flight.
        rng = random.Random(7)
        cls.src = os.path.join(cls.tmp, "src")
        cls.files = {}
        for i in range(60):
            rel = f"train/class{i % 3}/img{i:03}.bin" if i < 55 else f"val/img{i:03}.bin"
            cls.files[rel] = rng.randbytes(rng.randint(1, 40000))
        cls.files["index.bin"] = rng.randbytes(3 << 20)
        for rel, data in cls.files.items():
            path = os.path.join(cls.src, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        cls.aws("s3", "sync", cls.src, "s3://data/sets/one", "--only-show-errors")
        cls.aws("s3", "sync", cls.src, "s3://data/sets/two", "--only-show-errors")

    @classmethod
    def tearDownClass(cls):
        os.killpg(cls.server.pid, signal.SIGTERM)
        cls.server.wait(timeout=30)
        cls.server_log.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def aws(cls, *args):
        subprocess.run(["aws", "--endpoint-url", cls.endpoint, *args], env=cls.env, check=True,
                       stdout=subprocess.DEVNULL)

    def hpcdata(self, *args, **kw):
        kw.setdefault("env", self.env)
        return subprocess.Popen([sys.executable, HPCDATA, *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)

    def run_stage(self, *args):
        p = self.hpcdata("stage", *args)
        out, err = p.communicate(timeout=120)
        return p.returncode, out, err

    def gets(self, prefix):
        """How many times each object under s3://data/PREFIX was downloaded so far."""
        counts = {}
        with open(self.server_log_path) as f:
            for m in GET_OBJECT.finditer(f.read()):
                key = urllib.request.unquote(m["key"])
                if m["bucket"] == "data" and key.startswith(prefix):
                    counts[key[len(prefix):]] = counts.get(key[len(prefix):], 0) + 1
        return counts

    def object_times(self, prefix):
        """Each object's LastModified under s3://data/PREFIX, in whole seconds since the epoch."""
        out = subprocess.run(["aws", "--endpoint-url", self.endpoint, "s3api", "list-objects-v2", "--bucket", "data",
                              "--prefix", prefix, "--query", "Contents[].[Key,LastModified]", "--output", "json"],
                             env=self.env, check=True, stdout=subprocess.PIPE, text=True).stdout
        return {key[len(prefix):]: int(datetime.datetime.fromisoformat(when).timestamp())
                for key, when in json.loads(out)}

    def assert_staged(self, dest):
        for rel, data in self.files.items():
            with open(os.path.join(dest, rel), "rb") as f:
                self.assertEqual(hashlib.sha256(f.read()).hexdigest(), hashlib.sha256(data).hexdigest(), rel)
        staged = {os.path.relpath(os.path.join(d, n), dest) for d, _, names in os.walk(dest) for n in names}
        self.assertEqual(staged - set(self.files), {".hpcdata-staged.json"})  # and no lock file

    def test_concurrent_stagings_download_each_object_once(self):
        dest = os.path.join(self.tmp, "dest-concurrent")
        jobs = [self.hpcdata("stage", "s3://data/sets/one", dest, "--endpoint-url", self.endpoint, "--verify", "md5")
                for _ in range(2)]
        results = [j.communicate(timeout=120) for j in jobs]
        for j, (out, err) in zip(jobs, results):
            self.assertEqual(j.returncode, 0, err)
            self.assertEqual(out.strip(), dest)
        errs = "".join(err for _, err in results)
        self.assertIn("waiting for the staging into", errs)
        self.assertIn("already staged", errs)
        self.assert_staged(dest)
        counts = self.gets("sets/one/")
        self.assertEqual(set(counts), set(self.files))
        self.assertEqual({k: v for k, v in counts.items() if v != 1}, {})
        # A later job finds it complete without listing or downloading anything.
        code, _, err = self.run_stage("s3://data/sets/one/", dest, "--endpoint-url", self.endpoint)
        self.assertEqual(code, 0, err)
        self.assertIn("already staged", err)
        self.assertEqual(self.gets("sets/one/"), counts)

    def start_and_interrupt(self, dest, objects):
        """A staging of sets/two into dest, caught once `objects` objects were downloaded."""
        job = self.hpcdata("stage", "s3://data/sets/two", dest, "--endpoint-url", self.endpoint)
        deadline = time.monotonic() + 60
        while len(self.gets("sets/two/")) < objects:  # part-way: some objects downloaded, not all
            self.assertIsNone(job.poll(), "the staging finished before it could be interrupted")
            self.assertLess(time.monotonic(), deadline, "the staging did not start downloading")
            time.sleep(0.02)
        return job

    def test_interrupted_staging_resumes(self):
        dest = os.path.join(self.tmp, "dest-interrupted")
        # Stopped (a job's time limit: slurm/job.sh sends SIGTERM): it cleans up its lock file.
        job = self.start_and_interrupt(dest, 5)
        job.send_signal(signal.SIGTERM)
        _, err = job.communicate(timeout=60)
        self.assertEqual(job.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("stopped by SIGTERM", err.strip().splitlines()[-1])
        self.assertEqual(sorted(n for n in os.listdir(dest) if n.startswith(".hpcdata")), [".hpcdata-staging.json"])
        # Resumed, then killed with its aws, as a node loss would: the lock file stays, unheld.
        job = self.start_and_interrupt(dest, 10)
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        self.assertFalse(os.path.exists(os.path.join(dest, ".hpcdata-staged.json")))
        before = self.gets("sets/two/")
        self.assertLess(len(before), len(self.files))
        # Downloads land under temporary names, renamed when complete and then given the object's
        # time: what is under its own name with that time was complete at the cut (the aws CLI had
        # several more in flight, on a loaded machine one or two more than their count shows). One
        # cut between its rename and its time is fetched again, as `aws s3 sync` must: a file newer
        # than its object may be a different file.
        times = self.object_times("sets/two/")
        complete = [k for k in before if os.path.isfile(os.path.join(dest, k))
                    and int(os.stat(os.path.join(dest, k)).st_mtime) == times[k]]
        self.assertTrue(complete, "nothing was complete at the cut")
        # A temporary file as a download cut short leaves one.
        with open(os.path.join(dest, "index.bin.5e2F1a9C"), "wb") as f:
            f.write(b"half")
        code, out, err = self.run_stage("s3://data/sets/two", dest, "--endpoint-url", self.endpoint,
                                        "--verify", "md5")
        self.assertEqual(code, 0, err)
        self.assert_staged(dest)
        after = self.gets("sets/two/")
        # What was complete before the cut is not fetched again.
        again = [k for k in complete if after[k] > before[k]]
        self.assertEqual(again, [])
        self.assertEqual(set(after), set(self.files))


    def test_files_hpcdata_did_not_stage_are_kept_unless_delete(self):
        """As rsync and `aws s3 sync` without --delete: a refresh or a resumed staging removes what
        hpcdata itself put in DEST (an object since gone from the prefix), keeps anything else and
        says so in one line; --delete removes that too, saying so."""
        self.aws("s3", "sync", self.src, "s3://data/sets/three", "--only-show-errors")
        self.aws("s3", "cp", os.path.join(self.src, "index.bin"), "s3://data/sets/three/gone.bin", "--only-show-errors")
        dest = os.path.join(self.tmp, "dest-theirs")
        ep = ("--endpoint-url", self.endpoint)
        code, _, err = self.run_stage("s3://data/sets/three", dest, *ep)
        self.assertEqual(code, 0, err)
        self.assertTrue(os.path.isfile(os.path.join(dest, "gone.bin")))
        self.aws("s3", "rm", "s3://data/sets/three/gone.bin", "--only-show-errors")
        # Theirs, among them copies named as the AWS CLI's temporaries are (OBJECT.XXXXXXXX), which
        # only a staging cut short leaves: a refresh of a finished one found none of its own.
        mine = ("index.bin.20261129", "index.bin.original", "notes.txt", "train/mine.txt")
        for rel in mine:
            with open(os.path.join(dest, rel), "w") as f:
                f.write("mine")
        code, _, err = self.run_stage("s3://data/sets/three", dest, "--refresh", *ep)
        self.assertEqual(code, 0, err)
        self.assertFalse(os.path.exists(os.path.join(dest, "gone.bin")), "a staged object gone from s3 stayed")
        said = [line for line in err.splitlines() if "keeping" in line]
        self.assertEqual(len(said), 1, err)
        self.assertIn("keeping 4 file(s) in", said[0])
        self.assertIn("(e.g. index.bin.20261129); --delete would remove them", said[0])
        for rel in mine:
            with open(os.path.join(dest, rel)) as f:
                self.assertEqual(f.read(), "mine")
        code, _, err = self.run_stage("s3://data/sets/three", dest, "--refresh", "--delete", *ep)
        self.assertEqual(code, 0, err)
        self.assertIn("deleting 4 file(s) in", err)
        self.assertIn("as --delete asks", err)
        self.assert_staged(dest)
        # A resumed staging (one in progress of this source) keeps them as well.
        resumed = os.path.join(self.tmp, "dest-resumed")
        os.makedirs(resumed)
        with open(os.path.join(resumed, ".hpcdata-staging.json"), "w") as f:
            f.write('{"source": "s3://data/sets/three/"}')
        with open(os.path.join(resumed, "mine.txt"), "w") as f:
            f.write("mine")
        code, _, err = self.run_stage("s3://data/sets/three", resumed, *ep)
        self.assertEqual(code, 0, err)
        self.assertIn("keeping 1 file(s) in", err)
        with open(os.path.join(resumed, "mine.txt")) as f:
            self.assertEqual(f.read(), "mine")

    def test_errors_are_one_line_and_change_nothing(self):
        dest = os.path.join(self.tmp, "dest-errors")
        a_file = os.path.join(self.tmp, "a-file")
        with open(a_file, "w") as f:
            f.write("mine")
        # Someone's directory (the copy would delete what is not under the prefix).
        home = os.path.join(self.tmp, "home")
        os.makedirs(home)
        with open(os.path.join(home, "thesis.tex"), "w") as f:
            f.write("years of work")
        other = os.path.join(self.tmp, "dest-other")  # a staging of another prefix
        self.assertEqual(self.run_stage("s3://data/sets/one", other, "--endpoint-url", self.endpoint)[0], 0)
        unfinished = os.path.join(self.tmp, "dest-unfinished")  # an interrupted staging of another prefix
        os.makedirs(unfinished)
        with open(os.path.join(unfinished, ".hpcdata-staging.json"), "w") as f:
            f.write('{"source": "s3://data/sets/one/"}')
        with open(os.path.join(unfinished, "index.bin"), "w") as f:
            f.write("half")
        cwd = os.path.join(self.tmp, "cwd")  # an empty DEST must not mean the current directory
        os.makedirs(cwd)
        with open(os.path.join(cwd, "notes"), "w") as f:
            f.write("mine")
        ep = ("--endpoint-url", self.endpoint)
        cases = [
            (("http://data/x", dest), 2, "is not an S3 URL"),
            (("s3://", dest), 2, "names no bucket"),
            (("s3:///x", dest), 2, "names no bucket"),
            (("s3://bad_bucket!/x", dest), 2, "'bad_bucket!' is not a bucket name"),  # more in BucketNames
            (("s3://data/sets/one", ""), 2, "DEST is an empty path"),
            (("s3://data/sets/one", "/"), 2, "DEST / is the root directory / (an unset variable?)"),
            (("s3://data/sets/one", "/tmp/.."), 2, "DEST /tmp/.. is the root directory /"),
            (("s3://data/sets/one", a_file), 2, "exists and is not a directory"),
            (("s3://data/sets/one", os.path.join(a_file, "d")), 2, "d cannot be made or used: Not a directory"),
            (("s3://data/sets/one", dest, "--endpoint-url", "localhost:9"), 2, "is not an http:// or https:// URL"),
            (("s3://data/sets/one", dest, "--verify", "sha1"), 2, "invalid choice"),
            (("s3://data/sets/one", dest, "--wait-timeout", "0"), 2, "must be more than 0"),
            (("s3://data/sets/one", dest, "--wait-timeout", "soon"), 2, "is not a number of seconds"),
            (("s3://data/sets/one", dest, "--wait-timeout", "nan"), 2, "and finite"),
            (("s3://data/sets/one", dest, "--endpoint-url", "http://[::1"), 2, "is not an http:// or https:// URL"),
            (("s3://data/sets/two", other, *ep), 2, "holds a staging of s3://data/sets/one/"),
            (("s3://data/sets/two", unfinished, *ep), 2, "holds an unfinished staging of s3://data/sets/one/"),
            (("s3://data/sets/one", home, *ep), 2, "holds files that are not a staging of"),
            (("s3://data/no/such/prefix", dest, *ep), 1, "no objects under"),
            (("s3://missing-bucket/x", dest, *ep), 1, "failed"),
            # Nothing reached: the CLI's error, in one line.
            (("s3://data/sets/one", dest, "--endpoint-url", f"http://127.0.0.1:{free_port()}"), 1, "failed"),
        ]
        watched = (dest, a_file, home, other, unfinished, cwd)
        for args, code, message in cases:
            with self.subTest(args=args):
                before = snapshot(*watched)
                # One try where nothing answers (the CLI's retries would take seconds).
                p = self.hpcdata("stage", *args, cwd=cwd, env=dict(self.env, AWS_MAX_ATTEMPTS="1"))
                _, err = p.communicate(timeout=120)
                self.assertEqual(p.returncode, code, err)
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn(message, err)
                self.assertEqual(snapshot(*watched), before, "a refused staging changed files (a lock file left?)")

    def test_waiting_gives_up_after_the_timeout(self):
        dest = os.path.join(self.tmp, "dest-held")
        os.makedirs(dest)
        import fcntl

        with open(os.path.join(dest, ".hpcdata-stage.lock"), "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            held.write("node-7 pid 42\n")
            held.flush()
            start = time.monotonic()
            code, _, err = self.run_stage("s3://data/sets/one", dest, "--endpoint-url", self.endpoint,
                                          "--wait-timeout", "1.5")
        self.assertEqual(code, 1, err)
        self.assertGreaterEqual(time.monotonic() - start, 1.5)
        self.assertIn("waiting for the staging into", err)
        self.assertIn("node-7 pid 42", err)
        self.assertIn("gave up after 1.5 s", err)


if __name__ == "__main__":
    unittest.main()
