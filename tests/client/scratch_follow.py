import subprocess
from tests.client.test_cli_live import cli, ok, upload
from tests.fixtures.service import REPO_ROOT, fromscratch_cmd

def test_scratch(live_server, worker_proc):
    fid = upload(live_server)
    jid = ok(cli(live_server, "jobs", "create", "--file", fid, "--max-steps", 150, "--eval-every", 25)).stdout.split()[-1]
    env = {**live_server.env, "FROMSCRATCH_SERVER": live_server.url, "FROMSCRATCH_API_KEY": live_server.api_key}
    r = subprocess.run(["script", "-qec", " ".join(fromscratch_cmd("jobs", "follow", jid)), "/dev/null"], env={**env, "COLUMNS": "110", "TERM": "xterm"}, cwd=REPO_ROOT, capture_output=True, text=True)
    open("/tmp/follow_tty.txt", "w").write(r.stdout)
    print(ok(cli(live_server, "jobs", "show", jid)).stdout)
    print(ok(cli(live_server, "jobs", "list")).stdout)
    print(ok(cli(live_server, "files", "list")).stdout)
    print(ok(cli(live_server, "models", "list")).stdout)
