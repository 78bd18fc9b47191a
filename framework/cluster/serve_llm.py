"""A Ray Serve LLM application config checked by Ray's own classes (ray[serve] 2.60): the
`serve run` schema (ray.serve.schema.ServeDeploySchema), each application's builder args
(ray.serve.llm.LLMServingArgs: every LLMConfig, its deployment_config through Serve's
DeploymentConfig, accelerator_type among Ray's types), and each LLMConfig's engine kwargs as
Ray Serve LLM hands them to vLLM (LLMConfig.get_engine_config: every key an AsyncEngineArgs or
FrontendArgs field; get_initialization_kwargs). A data-parallel application
(`build_dp_openai_app`) is checked by its own args model (DPOpenAiServingArgs) and the DP size
check of its DPServer deployment (not by calling DPServer.get_deployment_options, which starts a
local Ray). A prefill/decode application (`build_pd_openai_app`) is checked by its args model
(PDServingArgs: one model id, a kv_transfer_config on both sides), then each of its two
LLMConfigs as above. Nothing is started and no model is read. Importing ray.serve.llm imports
vLLM."""

from __future__ import annotations

from collections.abc import Mapping

from framework.base.errors import ConfigError
from framework.fleet.ray_serve import RAY_SERVE_DP_BUILDER
from framework.fleet.ray_serve import RAY_SERVE_PD_BUILDER


def check_ray_serve_config(doc: Mapping[str, object], where: str = "ray-serve config") -> int:
    """Raise ConfigError (naming the failing part) unless Ray Serve accepts `doc`; returns the
    number of LLM configs checked."""
    try:
        from ray.serve.llm import LLMServingArgs
        from ray.serve.schema import ServeDeploySchema
    except ImportError as exc:
        raise ConfigError(where, "ray.serve.llm", str(exc),
                          "Ray Serve LLM is not importable: pip install 'ray[serve]'") from exc
    checked = 0
    try:
        schema = ServeDeploySchema.model_validate(dict(doc))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ConfigError(where, "applications", "", _first_line(exc)) from exc
    for app in schema.applications:
        try:
            for config in _llm_configs(app.import_path, app.args, LLMServingArgs):
                config.get_engine_config().get_initialization_kwargs()
                checked += 1
        except (ValueError, TypeError) as exc:
            raise ConfigError(where, f"applications.{app.name}.args", "", _first_line(exc)) from exc
    return checked


def _llm_configs(import_path: str, args: object, serving_args: type) -> list:
    """The LLMConfigs of one application's builder args, by its builder (`serving_args`:
    ray.serve.llm.LLMServingArgs, imported where its absence is reported)."""
    if import_path == RAY_SERVE_DP_BUILDER:
        from ray.llm._internal.serve.serving_patterns.data_parallel.builder import DPOpenAiServingArgs

        config = DPOpenAiServingArgs.model_validate(args).llm_config
        # DPServer.get_deployment_options' own check of the size (dp_server.py); the method
        # itself is not called: it starts a local Ray instance where none runs
        dp_size = config.engine_kwargs.get("data_parallel_size", 1)
        if not (isinstance(dp_size, int) and dp_size > 0):
            raise ValueError(f"Invalid data_parallel_size: {dp_size}, expecting positive "
                             "integer.")
        return [config]
    if import_path == RAY_SERVE_PD_BUILDER:
        from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs

        pd = PDServingArgs.model_validate(args)
        return [pd.prefill_config, pd.decode_config]
    return list(serving_args.model_validate(args).llm_configs)  # type: ignore[attr-defined]


def _first_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text[:400]
