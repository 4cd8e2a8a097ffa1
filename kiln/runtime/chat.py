"""Chat templates: a package's Jinja chat template applied to messages, as HF ``apply_chat_template`` does."""

from __future__ import annotations

from typing import Any

from kiln.errors import KilnError


def render_chat(template: str, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                **variables: Any) -> str:
    """A chat template (Jinja, as HF ``apply_chat_template`` runs it: a sandboxed environment, ``trim_blocks`` and
    ``lstrip_blocks``) applied to ``messages`` (``[{"role": ..., "content": ...}]``).

    Raises:
        KilnError: a message without a string role or content.
    """
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise KilnError(f"a chat message must be {{'role': str, 'content': str}}, got {m!r}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                            **variables)
