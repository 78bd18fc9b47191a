"""Credential-like names refused in a sweep file (#33 item 4): the name rule over a table of names
(the installed vLLM's own serve flags and environment variables among them), the one-line
refusal in server.args, server.env and the search space with the value hidden, vLLM's dev mode
refused in server.env, and server.secret_env's rules."""

from __future__ import annotations

import pytest
import yaml

from framework.base.errors import ConfigError
from framework.config.secret_names import looks_secret
from framework.config.specs import load_sweep
from framework.engine.flag_check import installed_vllm_flags

BASE = "name: t\nmodel: models/m\nsearch_space: spaces/s.yaml\n"
VALUE = "hf_NOT-FOR-FILES-0123456789"


@pytest.mark.parametrize("name", [
    "hf-token", "hf_token", "--hf-token", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "GITHUB_TOKEN",
    "AWS_SESSION_TOKEN", "api-key", "API_KEY", "OPENAI_API_KEY", "MY_API_KEY", "WANDB_API_KEY",
    "apikey", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "S3_ACCESS_KEY_ID", "client-secret",
    "CLIENT_SECRET", "db-password", "PGPASSWORD", "MYSQL_PWD_PASSWD", "hf-access-token",
    "private-key", "key", "token", "Secret",
])
def test_credential_names(name):
    assert looks_secret(name)


@pytest.mark.parametrize("name", [
    # word parts, not substrings: tokens, tokenizer, keyfile are no credential words
    "max-num-batched-tokens", "max-tokens", "tokenizer", "tokenizer-mode", "tokenizer-revision",
    "skip-tokenizer-init", "tokens-only", "spec-tokens", "kv-cache-dtype", "ssl-keyfile",
    "enable-prompt-tokens-details", "max-num-queued-tokens", "TOKENIZERS_PARALLELISM",
    # `token` counting text tokens
    "long-prefill-token-threshold", "dbo-decode-token-threshold", "return-tokens-as-token-ids",
    "VLLM_MULTI_STREAM_GEMM_TOKEN_THRESHOLD", "VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD",
    # where a credential lies, not the credential
    "HF_TOKEN_PATH", "api-key-file", "ssl-ca-certs", "SECRET_DIR",
    # neighbours
    "allow-credentials", "enable-ssl-refresh", "HF_HUB_OFFLINE", "VLLM_CPU_KVCACHE_SPACE", "PWD",
    "max-model-len",
])
def test_names_that_are_no_credentials(name):
    assert not looks_secret(name)


def test_of_the_installed_vllms_serve_flags_only_the_two_credentials_are_refused():
    flags = installed_vllm_flags()
    if flags is None:
        pytest.skip("vLLM is not installed here")
    assert {"max-num-batched-tokens", "tokenizer-mode", "long-prefill-token-threshold"} <= flags
    assert sorted(f for f in flags if looks_secret(f)) == ["api-key", "hf-token"]


def test_of_the_installed_vllms_environment_variables_only_credentials_are_refused():
    envs = pytest.importorskip("vllm.envs")
    refused = sorted(n for n in envs.environment_variables if looks_secret(n))
    assert set(refused) <= {"VLLM_API_KEY", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"}, refused
    assert "VLLM_API_KEY" in refused


@pytest.mark.parametrize(("server", "key", "variable"), [
    ("{args: {hf-token: %s}}", "server.args.hf-token", "HF_TOKEN"),
    ("{args: {max-model-len: 512, HF_token: %s}}", "server.args.HF_token", "HF_TOKEN"),
    ("{args: {db-password: %s}}", "server.args.db-password",
     "the environment variable the servers read"),
    ("{args: {hf-token: [%s]}}", "server.args.hf-token", "HF_TOKEN"),  # before any type check
    ("{env: {HF_TOKEN: %s}}", "server.env.HF_TOKEN", "HF_TOKEN"),
    ("{env: {HF_HUB_OFFLINE: '1', AWS_SECRET_ACCESS_KEY: %s}}",
     "server.env.AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
    ("{env: {MY_API_KEY: %s}}", "server.env.MY_API_KEY", "MY_API_KEY"),
])
def test_a_credential_in_the_sweep_file_is_one_line_naming_the_safe_way(tmp_path, server, key,
                                                                        variable):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"server: {server % VALUE}\n")
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    message = str(info.value)
    assert (info.value.file, info.value.key, info.value.value) == (str(path), key, "<hidden>")
    assert f"set {variable} in the driver's environment and list it in server.secret_env" in message
    assert VALUE not in message and "\n" not in message


def test_legitimate_vllm_flags_with_credential_like_words_pass(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "server: {args: {max-num-batched-tokens: 512, tokenizer-mode: auto, "
                    "long-prefill-token-threshold: 64, ssl-keyfile: k.pem}, "
                    "env: {HF_TOKEN_PATH: /run/hf, TOKENIZERS_PARALLELISM: 'false'}}\n")
    assert load_sweep(path).server.args["max-num-batched-tokens"] == 512


@pytest.mark.parametrize("name", ["VLLM_SERVER_DEV_MODE", "vllm_server_dev_mode"])
def test_dev_mode_in_server_env_is_refused_in_one_line(tmp_path, name):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"server: {{env: {{{name}: '1'}}}}\n")
    with pytest.raises(ConfigError, match="dev mode") as info:
        load_sweep(path)
    assert info.value.key == f"server.env.{name}" and "\n" not in str(info.value)


@pytest.mark.parametrize(("secret_env", "key", "reason"), [
    ("[VLLM_API_KEY]", "server.secret_env", "server.api_key_env"),
    ("[VLLM_SERVER_DEV_MODE]", "server.secret_env", "dev mode"),
    ("['HF TOKEN']", "server.secret_env", "name an environment variable"),
    ("[HF_TOKEN, HF_TOKEN]", "server.secret_env", "repeats"),
])
def test_secret_env_rules(tmp_path, secret_env, key, reason):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + f"server: {{secret_env: {secret_env}}}\n")
    with pytest.raises(ConfigError, match=reason) as info:
        load_sweep(path)
    assert info.value.key == key


def test_a_secret_env_name_is_not_also_in_env(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "server: {secret_env: [S3_CONF], env: {S3_CONF: hidden-value}}\n")
    with pytest.raises(ConfigError, match="keep it there alone") as info:
        load_sweep(path)
    assert (info.value.key, info.value.value) == ("server.env.S3_CONF", "<hidden>")


def test_secret_env_names_are_kept(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "server: {secret_env: [HF_TOKEN, AWS_SECRET_ACCESS_KEY]}\n")
    assert load_sweep(path).server.secret_env == ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY")


def _sweep(tmp_path, tiny_model, parameters=None, server=None):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"parameters": parameters or {
        "max-num-seqs": {"type": "categorical", "choices": [4, 8]}}}))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "k", "model": str(tiny_model),
                                    "search_space": str(space), "search": {"baseline": False},
                                    **({"server": server} if server else {})}))
    return path


@pytest.mark.parametrize("name", ["hf-token", "HF_TOKEN", "client-secret", "db_password"])
def test_a_credential_is_no_search_parameter(tmp_path, tiny_model, name):
    from framework.sweep import loader as sweep_mod

    path = _sweep(tmp_path, tiny_model, {name: {"type": "categorical",
                                                "choices": ["s3cret-a", "s3cret-b"]}})
    with pytest.raises(ConfigError, match=r"server\.secret_env") as err:
        sweep_mod.load(path, check_flags=False)
    assert err.value.key == f"parameters.{name}" and err.value.value == "<hidden>"
    assert "s3cret" not in str(err.value)


def test_a_secret_env_variable_must_be_set_before_a_run(tmp_path, tiny_model, monkeypatch):
    from framework.sweep import loader as sweep_mod

    monkeypatch.delenv("VSWEEP_TEST_HF_TOKEN", raising=False)
    path = _sweep(tmp_path, tiny_model, server={"secret_env": ["VSWEEP_TEST_HF_TOKEN"]})
    assert sweep_mod.load(path, check_flags=False).spec.server.secret_env  # status, best, ...
    with pytest.raises(ConfigError, match="VSWEEP_TEST_HF_TOKEN is not set") as err:
        sweep_mod.load(path)
    assert err.value.key == "server.secret_env"


def test_servers_get_the_secret_env_variables_with_the_api_key(tmp_path, monkeypatch):
    from framework.sweep.loader import server_env
    from framework.sweep.loader import server_secrets

    monkeypatch.setenv("HF_TOKEN", VALUE)
    path = tmp_path / "s.yaml"
    path.write_text(BASE + "server: {secret_env: [HF_TOKEN], env: {HF_HUB_OFFLINE: '0'}}\n")
    spec = load_sweep(path)
    assert server_secrets(spec, None) == {"HF_TOKEN": VALUE}
    assert server_secrets(spec, "k") == {"HF_TOKEN": VALUE, "VLLM_API_KEY": "k"}
    assert VALUE not in str(server_env(spec))  # the actor's runtime_env: recorded by Ray
