"""The XRootD hooks' own decisions, without a server: the query reply within XRootD 5.5's 2 KB,
whose identity a stage is made under, and the prepare program's command line."""
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))
from carousel_client import api, xrd  # noqa: E402


def reply_for(n, error=""):
    return {"request_id": "52667f000001:277289e9.6b041be5:1", "responses": [
        {"path": f"/exp/run1/file{i:03d}.root", "path_exists": True, "on_tape": True, "online": False,
         "requested": True, "has_reqid": True, "req_time": "1795000000", "error_text": error} for i in range(n)]}


def test_the_query_reply_fits_2_kb_whole_or_is_not_sent():
    text = xrd.fit_reply(reply_for(10), 2048)
    assert len(text.encode()) <= 2047 and json.loads(text) == reply_for(10)
    # Long error texts are shortened, never the responses or their order.
    shortened = json.loads(xrd.fit_reply(reply_for(9, error="x" * 500), 2048))
    assert [r["path"] for r in shortened["responses"]] == [r["path"] for r in reply_for(9)["responses"]]
    assert all(r["error_text"] == "x" * len(r["error_text"]) for r in shortened["responses"])
    assert xrd.fit_reply(reply_for(40), 2048) is None  # too many paths for 5.5: refused, not cut
    assert json.loads(xrd.fit_reply(reply_for(40), 16384)) == reply_for(40)  # 5.6 with -maxresp 16k


def test_the_prepare_command_line_as_libXrdOfsPrepGPI_builds_it():
    assert xrd.parse_prepare(["-p", "2", "-n", "rdy", "-w", "--", "id1", "stage", "/a", "/b"]) == (
        {"-p": "2", "-n": "rdy", "-w": True}, "id1", "stage", ["/a", "/b"])
    assert xrd.parse_prepare(["--", "id2", "query", "/a"]) == ({}, "id2", "query", ["/a"])
    with pytest.raises(ValueError):
        xrd.parse_prepare(["-p", "1"])


def test_a_mapped_identity_is_used_only_from_a_protected_map_file(tmp_path):
    mapfile = tmp_path / "usermap"
    mapfile.write_text("# pattern user\nalice@*.farm.example.org alice\nprod@vobox.example.org production\n")
    mapfile.chmod(0o644)
    env = {"CAROUSEL_XRD_USERMAP": str(mapfile)}
    assert xrd.on_behalf_of("alice.1234:22@wn7.farm.example.org", env) == "alice"
    assert xrd.on_behalf_of("prod.9:1@vobox.example.org", env) == "production"
    assert xrd.on_behalf_of("alice.1234:22@laptop.example.com", env) is None
    assert xrd.on_behalf_of("alice.1234:22@wn7.farm.example.org", {}) is None  # no map: no mapping
    mapfile.chmod(0o666)
    assert xrd.on_behalf_of("alice.1234:22@wn7.farm.example.org", env) is None  # anyone could edit it


def test_a_malformed_line_of_the_map_is_said_in_the_log(tmp_path, capsys):
    """It was dropped without a word, and its clients' requests went to the token's account."""
    mapfile = tmp_path / "usermap"
    mapfile.write_text("garbage line without user\nalice@*.farm.example.org alice\n")
    mapfile.chmod(0o644)
    env = {"CAROUSEL_XRD_USERMAP": str(mapfile)}
    assert xrd.on_behalf_of("alice.1234:22@wn7.farm.example.org", env) == "alice"
    assert f"{mapfile} line 1: expected PATTERN USER, ignored" in capsys.readouterr().err


def test_stage_sends_on_behalf_of_only_for_a_mapped_client(tmp_path, monkeypatch):
    sent = []

    def server(request):
        sent.append(json.loads(request.content))
        return httpx.Response(201, json={"bulk_id": "b", "files": 1, "created": 1, "existing": 0, "shared": 0})
    client = api.Client(api.Config("http://carousel.test", "k"), transport=httpx.MockTransport(server))
    mapfile = tmp_path / "usermap"
    mapfile.write_text("alice@wn*.example.org alice\n")
    mapfile.chmod(0o600)
    monkeypatch.setenv("CAROUSEL_XRD_USERMAP", str(mapfile))
    monkeypatch.setenv("XRDPREP_TID", "alice.1:2@wn1.example.org")
    xrd.prepare_stage(client, "rid", ["/a"], {"-p": "3"})
    monkeypatch.setenv("XRDPREP_TID", "alice.1:2@elsewhere.org")
    xrd.prepare_stage(client, "rid2", ["/a"], {})
    assert sent == [{"paths": ["/a"], "label": "rid", "priority": 3, "on_behalf_of": "alice"},
                    {"paths": ["/a"], "label": "rid2"}]


def test_a_priority_that_is_not_a_number_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("CAROUSEL_URL", "http://carousel.test")
    monkeypatch.setenv("CAROUSEL_TOKEN", "k")
    for argv in (["-p", "x", "--", "id1", "stage", "/a"], ["-p", "x"]):
        assert xrd.prepare_main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
    with pytest.raises(ValueError, match="-p takes a priority"):
        xrd.parse_prepare(["-p", "x", "--", "id1", "stage", "/a"])


def test_the_hooks_run_from_their_environment_alone(tmp_path, monkeypatch):
    # XRootD started with root's HOME: a client.ini there is not the hooks' (and may not be readable).
    ini = tmp_path / ".config" / "carousel" / "client.ini"
    ini.parent.mkdir(parents=True)
    ini.write_bytes(b"[carousel]\nurl = http://elsewhere.test\ntoken = \xff\xfe\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CAROUSEL_URL", "http://carousel.test")
    monkeypatch.setenv("CAROUSEL_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.delenv("CAROUSEL_TOKEN", raising=False)
    (tmp_path / "token").write_text("k\n")
    carousel = xrd.client()
    assert carousel.config.url == "http://carousel.test" and carousel.config.token == "k"


@pytest.mark.skipif(os.geteuid() != 0, reason="becomes another user")
def test_a_home_the_user_cannot_read_is_one_line_for_carousel_and_nothing_for_the_hooks(tmp_path):
    # As XRootD's user with HOME still pointing at root's: the file exists, it cannot be read.
    home = tmp_path / "root-home"
    (home / ".config" / "carousel").mkdir(parents=True)
    (home / ".config" / "carousel" / "client.ini").write_text("[carousel]\ntoken = root's\n")
    home.chmod(0o700)
    # Everything is imported as root (the interpreter lives in root's home here), then the
    # process becomes nobody, as xrootd -R nobody is. The hook has its token in the environment;
    # the command then needs the file's.
    client = str(Path(__file__).resolve().parent.parent / "client")
    code = (f"import certifi, httpcore, json, os, pwd, sys; certifi.where(); sys.path.insert(0, {client!r}); "
            "from carousel_client import cli, xrd; "
            "nobody = pwd.getpwnam('nobody'); os.setgid(nobody.pw_gid); os.setuid(nobody.pw_uid); "
            "os.environ['CAROUSEL_TOKEN'] = 'k'; xrd.client(); print('hook configured', flush=True); "
            "del os.environ['CAROUSEL_TOKEN']; sys.exit(cli.main(['ls']))")
    # The system's CA bundle (world-readable), as on an XRootD host: nobody cannot read certifi's,
    # in this checkout's .venv, when the checkout sits in a directory only root reads (a clone
    # under `mktemp -d`: the client's TLS context then failed to build, PermissionError).
    done = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home), "CAROUSEL_URL": "http://127.0.0.1:9",
                               "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"})
    assert done.stdout == "hook configured\n", done.stderr
    assert done.returncode == api.EXIT_CONFIG, done.stderr
    assert done.stderr.splitlines() == [f"carousel: cannot read {home}/.config/carousel/client.ini: Permission "
                                        "denied; set CAROUSEL_CONFIG, or CAROUSEL_URL and CAROUSEL_TOKEN"]


def test_stage_leaves_out_the_paths_the_server_refuses_and_stages_the_rest(capsys):
    """One bad path refused the whole list, and XRootD, which only logs the hook's exit code,
    told its client all were staged: now the good ones are staged and the bad ones named."""
    sent = []

    def server(request):
        paths = json.loads(request.content)["paths"]
        sent.append(paths)
        bad = [{"index": i, "line": i + 1, "path": p, "message": "not an absolute path"}
               for i, p in enumerate(paths) if not p.startswith("/")]
        if bad:
            return httpx.Response(400, json={"status": 400, "code": "invalid", "detail": "rejected", "errors": bad})
        return httpx.Response(201, json={"bulk_id": "b", "files": len(paths), "created": 1, "existing": 0,
                                         "shared": 0})
    client = api.Client(api.Config("http://carousel.test", "k"), transport=httpx.MockTransport(server))
    assert xrd.prepare_stage(client, "rid", ["relative", "/ok/a", "x/../y", "/ok/b"], {}) == 1
    assert sent[-1] == ["/ok/a", "/ok/b"]
    err = capsys.readouterr().err
    assert "'relative' refused: not an absolute path" in err and "'x/../y' refused" in err and "2 files" in err


def test_query_and_cancel_match_a_path_however_its_slashes_were_sent(monkeypatch):
    rows = [{"id": 7, "path": "/xrd/d1/a", "state": "queued", "error_class": "", "tape": None, "last_error": "",
             "created_at": "2026-11-30T08:00:00Z"}]
    posted = []

    def server(request):
        if request.url.path.endswith("/bulks/"):
            return httpx.Response(200, json={"results": [{"id": "b1", "label": "xr1"}], "next": None})
        if request.url.path.endswith("/requests/cancel/"):
            posted.append(json.loads(request.content))
            return httpx.Response(200, json={"cancelled": 1})
        return httpx.Response(200, json={"results": rows, "next": None})
    client = api.Client(api.Config("http://carousel.test", "k"), transport=httpx.MockTransport(server))
    (answer,) = xrd.query_reply(client, "xr1", ["//xrd//d1/a"])["responses"]
    assert answer["path"] == "//xrd//d1/a" and answer["requested"] and answer["has_reqid"]
    xrd.prepare_cancel(client, "xr1", ["//xrd/d1//a"])
    assert posted == [{"ids": [7]}]


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_a_bad_maxresp_is_one_line(monkeypatch, capsys, value):
    monkeypatch.setenv("CAROUSEL_URL", "http://carousel.test")
    monkeypatch.setenv("CAROUSEL_TOKEN", "k")
    monkeypatch.setenv("CAROUSEL_XRD_MAXRESP", value)
    assert xrd.prepare_main(["--", "xr2", "query", "/xrd/d2/a"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "CAROUSEL_XRD_MAXRESP" in err[0] and "Traceback" not in err[0]


def test_the_hooks_hints_name_what_the_hooks_read(monkeypatch, capsys):
    """They pointed at ~/.config/carousel/client.ini and CAROUSEL_RETRY_S, which the hooks ignore."""
    monkeypatch.delenv("CAROUSEL_URL", raising=False)
    monkeypatch.delenv("CAROUSEL_TOKEN", raising=False)
    assert xrd.prepare_main(["--", "xr3", "query", "/a"]) == 1
    err = capsys.readouterr().err
    assert "XRootD's environment" in err and "client.ini" not in err
    error = api.ClientError("cannot reach Carousel at http://x", code=api.EXIT_UNAVAILABLE,
                            hint="check CAROUSEL_URL (CAROUSEL_RETRY_S=SECONDS: keep trying that long)")
    assert "CAROUSEL_RETRY_S" not in xrd.explained(error)


def test_a_bad_maxresp_does_not_stop_staging(monkeypatch):
    """Only query's reply is bounded by it: stage, cancel and evict go on (a site with "64k" set
    stopped staging altogether)."""
    def server(request):
        return httpx.Response(201, json={"bulk_id": "b", "files": 1, "created": 1, "existing": 0, "shared": 0})
    client = api.Client(api.Config("http://carousel.test", "k"), transport=httpx.MockTransport(server))
    monkeypatch.setattr(xrd, "client", lambda patience=600.0: client)
    monkeypatch.setenv("CAROUSEL_XRD_MAXRESP", "64k")
    assert xrd.prepare_main(["--", "xr4", "stage", "/a"]) == 0


def test_a_refusal_naming_no_path_sent_is_not_resent_for_ever():
    sent = []

    def server(request):
        sent.append(1)
        return httpx.Response(400, json={"status": 400, "code": "invalid", "detail": "rejected",
                                         "errors": [{"index": 7, "path": "/x", "message": "odd"}, {"index": "0"}]})
    client = api.Client(api.Config("http://carousel.test", "k"), transport=httpx.MockTransport(server))
    with pytest.raises(api.ClientError):
        xrd.prepare_stage(client, "rid", ["/a"], {})
    assert len(sent) == 1


def test_a_hint_about_the_token_file_is_kept():
    error = api.ClientError("cannot read CAROUSEL_TOKEN_FILE", code=api.EXIT_CONFIG,
                            hint="check CAROUSEL_TOKEN_FILE and that this user may read it")
    assert "that this user may read it" in xrd.explained(error)
