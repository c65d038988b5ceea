"""The ``[shadow]`` table of the configuration."""

from __future__ import annotations

from pydantic import Field

from lavad.daemon.config_file import Section


class ShadowSettings(Section):
    """Shadow mode: follow the existing scheduler, publish lavad's choices as advice."""

    enabled: bool = Field(
        default=False,
        description="follow vm.placed events (the actual cluster) and place the same requests"
        " beside it with the configured policy, as advice",
    )
    topic: str = Field(
        default="lavad.shadow",
        min_length=1,
        max_length=249,
        description="where lavad's side's decisions go, marked as advice (never as placements)",
    )
