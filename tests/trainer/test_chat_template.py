"""The exports carry the service's chat format as a Jinja `chat_template`, and their consumers render
a conversation exactly as /v1/chat/completions does (trainer.data.chat.chat_prompt): transformers'
apply_chat_template for the Hugging Face folder, llama-cpp-python's Jinja formatter on the GGUF's
own metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import ModelConfig
from trainer.data.chat import JINJA_CHAT_TEMPLATE, chat_prompt, chat_template
from trainer.data.tokenizers import ByteTokenizer
from trainer.export import export_model
from trainer.model.llama import Llama

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief.\nVery."},
        {"role": "user", "content": "naïve café 🙂"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "  spaces  "},
    ],
]
PARTS = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]


def _export(fmt: str, out: Path) -> Path:
    cfg = ModelConfig(n_layer=1, n_head=2, n_embd=32, ctx=32, vocab_size=ByteTokenizer().vocab_size)
    state = Llama(cfg).state_dict()
    return export_model(cfg, state, ByteTokenizer(), fmt, out, "f32")


def test_hf_folder_renders_chat_as_the_service_does(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_export("hf", tmp_path / "hf"))
    for messages in CONVERSATIONS:
        assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == chat_prompt(
            messages
        )
        assert tok.apply_chat_template(messages, tokenize=False) == chat_template(messages)
    assert tok.apply_chat_template(PARTS, tokenize=False, add_generation_prompt=True) == chat_prompt(
        [{"role": "user", "content": "Hello"}]
    )


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_gguf_carries_the_template_llama_cpp_renders(messages: list[dict], tmp_path: Path) -> None:
    import gguf
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    reader = gguf.GGUFReader(_export("gguf", tmp_path / "m.gguf"))
    field = reader.fields["tokenizer.chat_template"]
    template = field.contents()
    assert template == JINJA_CHAT_TEMPLATE
    formatter = Jinja2ChatFormatter(template, eos_token="</s>", bos_token="<s>", add_generation_prompt=True)
    assert formatter(messages=messages).prompt == chat_prompt(messages)
