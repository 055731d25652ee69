"""The chat format, in one place: how a conversation is written as text for training
(trainer.data.records renders chat records with it), for a prompt (the worker's
/v1/chat/completions) and in exports (a Jinja `chat_template`, as transformers and llama.cpp read
it). Torch-free: the API takes its roles from here.

A message is "<|{role}|>\\n{content}\\n"; a prompt ends with the assistant's header, and a reply ends
where the model begins the next message's header (CHAT_STOP) or at EOS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, get_args

# The roles a message may have, in training data and in a prompt alike, so a model is prompted with
# the roles it was trained on.
ChatRole = Literal["system", "user", "assistant"]
CHAT_ROLES: tuple[str, ...] = get_args(ChatRole)
# OpenAI's other names for them: `developer` is its newer `system`
ROLE_ALIASES = {"developer": "system"}


def canonical_role(role: str) -> str:
    """A role as the template renders it (an alias as the role it names; anything else unchanged)."""
    return ROLE_ALIASES.get(role, role)


ASSISTANT = "assistant"
CHAT_STOP = "\n<|"  # a reply ends where the next message's role header begins


def role_header(role: str) -> str:
    return f"<|{role}|>\n"


ASSISTANT_HEADER = role_header(ASSISTANT)


def chat_template(messages: Iterable[Mapping[str, Any]]) -> str:
    """Render chat messages (string contents) as plain text: "<|{role}|>\\n{content}\\n" per message."""
    return "".join(f"{role_header(m['role'])}{m['content']}\n" for m in messages)


def chat_prompt(messages: Iterable[Mapping[str, Any]]) -> str:
    """The conversation as training data renders it, then the header of the reply to write."""
    return chat_template(messages) + ASSISTANT_HEADER


# chat_prompt as a Jinja template (transformers' apply_chat_template, llama.cpp's --jinja); content may
# also be OpenAI's list of text parts, joined as the trainer joins them. Newlines are written as
# expressions: both consumers render with trim_blocks, which drops a newline after a block tag.
JINJA_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
