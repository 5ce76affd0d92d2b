#!/usr/bin/env bash
# Installs the Amazon CloudWatch agent unless it is there, from AWS's .deb for DISTRO (debian: the
# head node; ubuntu: the compute image), after checking the package's signature against the key
# whose fingerprint AWS publishes ("Verifying the signature of the CloudWatch agent package", the
# CloudWatch user guide): a package that is not AWS's, or was changed on its way, is not
# installed. Run as root by bootstrap_head.sh and prepare_compute.sh. The compute nodes' user data
# does the same before the repository is fetched (cluster.yaml, Boot/CloudWatchAgent);
# tests/cloudformation/template_test.py's CloudWatchAgent runs both.
#
#   install_cloudwatch_agent.sh debian|ubuntu
set -euo pipefail
AGENT_KEY_FINGERPRINT=937616F3450B7D806CBD9725D58167303B789C72
case "${1:-}" in
  debian | ubuntu) distro=$1 ;;
  *) echo "install_cloudwatch_agent.sh: error: usage: install_cloudwatch_agent.sh debian|ubuntu" >&2; exit 2 ;;
esac
[[ -x /opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl ]] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
url=https://s3.amazonaws.com/amazoncloudwatch-agent/$distro/amd64/latest/amazon-cloudwatch-agent.deb
# A stalled or unreachable S3 fails the bootstrap rather than hang it until the stack's 45-minute
# signal timeout: each try gives up after 10 s without a connection or 30 s under 10 kB/s (a silent
# server), so 6 tries and curl's pauses (1 to 16 s) take about 3.5 minutes per file; 10 minutes caps a trickle.
curl -fsSL --retry 5 --connect-timeout 10 --speed-limit 10240 --speed-time 30 --max-time 600 -o "$work/agent.deb" "$url"
curl -fsSL --retry 5 --connect-timeout 10 --speed-limit 10240 --speed-time 30 --max-time 600 -o "$work/agent.deb.sig" "$url.sig"
curl -fsSL --retry 5 --connect-timeout 10 --speed-limit 10240 --speed-time 30 --max-time 600 -o "$work/key.gpg" https://s3.amazonaws.com/amazoncloudwatch-agent/assets/amazon-cloudwatch-agent.gpg
# The key file comes with the package and proves nothing by itself: what counts is that the
# signature is valid and made by the key of AWS's fingerprint (VALIDSIG's last field: the primary key's).
gpg --batch --quiet --homedir "$work" --import "$work/key.gpg" 2> /dev/null || true
# (grep reads to the end, not -q: gpg cut off by a closed pipe would fail the pipeline under pipefail.)
if ! gpg --batch --homedir "$work" --status-fd 1 --verify "$work/agent.deb.sig" "$work/agent.deb" 2> /dev/null |
  grep "^\[GNUPG:\] VALIDSIG .* $AGENT_KEY_FINGERPRINT\$" > /dev/null; then
  echo "install_cloudwatch_agent.sh: error: $url is not signed by AWS's CloudWatch agent key ($AGENT_KEY_FINGERPRINT): not installed" >&2
  exit 1
fi
dpkg -i "$work/agent.deb"
