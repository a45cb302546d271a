"""Chat templates rendered the way HF `apply_chat_template(..., tokenize=False)` renders them.

The templates below are written for these tests in the shapes of well-known model families; the
expected strings are spelled out by hand, so a change in environment settings shows up as a diff.
"""

import json
import re

import pytest
from jinja2.sandbox import SecurityError

from gateway.translate.chat_template import ChatTemplate, ChatTemplateError, render_prompt

# ChatML as Qwen2 ships it: one line, newlines as '\n' escapes inside Jinja string literals,
# and a default system message when the conversation has none.
CHATML = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The same format written over several lines: trim_blocks/lstrip_blocks must eat the layout.
CHATML_MULTILINE = """\
{% for message in messages %}
    {% if loop.first and message.role != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
    {% endif %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""

# Llama 2: system folded into the first user turn, bos before each [INST], roles must alternate.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}"
    "{% set loop_messages = messages[1:] %}"
    "{% set system_message = '<<SYS>>\\n' + messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}"
    "{% else %}"
    "{% set loop_messages = messages %}{% set system_message = '' %}"
    "{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% set content = system_message + message['content'] if loop.first else message['content'] %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
)

# Mistral-like: a namespace carries the system prompt out of a loop (plain `set` would not), it is
# put in front of the last user turn only (`loop.last`), and tools go in as JSON.
MISTRAL_LIKE = (
    "{% set ns = namespace(system='', turns=0) %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' %}{% set ns.system = message.content %}{% continue %}{% endif %}"
    "{% set ns.turns = ns.turns + 1 %}"
    "{% endfor %}"
    "{{ bos_token }}"
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for message in messages | rejectattr('role', 'equalto', 'system') %}"
    "{% if message.role == 'user' %}"
    "[INST] {% if loop.last and ns.system %}{{ ns.system }}\n\n{% endif %}{{ message.content }}[/INST]"
    "{% else %}{{ message.content }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if ns.turns == 0 %}{{ raise_exception('no user or assistant turn') }}{% endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


# --- well-known formats -------------------------------------------------------------------------

def test_chatml_adds_default_system_message_and_generation_prompt():
    prompt = ChatTemplate(CHATML).render([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chatml_keeps_given_system_message_and_omits_prompt_when_asked():
    prompt = ChatTemplate(CHATML).render(CONVERSATION, add_generation_prompt=False)
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )


def test_multiline_template_layout_is_trimmed_like_hf():
    messages = [{"role": "user", "content": "Hi"}]
    assert ChatTemplate(CHATML_MULTILINE).render(messages) == ChatTemplate(CHATML).render(messages)


def test_llama2_folds_system_into_first_turn_with_bos_and_eos():
    prompt = ChatTemplate(LLAMA2, bos_token="<s>", eos_token="</s>").render(CONVERSATION)
    assert prompt == "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] Bye [/INST]"


def test_llama2_role_alternation_error_surfaces_the_template_message():
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match=re.escape("Conversation roles must alternate user/assistant/")):
        ChatTemplate(LLAMA2).render(messages)


def test_namespace_and_loop_last_place_system_before_final_user_turn():
    prompt = ChatTemplate(MISTRAL_LIKE, bos_token="<s>", eos_token="</s>").render(CONVERSATION)
    assert prompt == "<s>[INST] Hi[/INST]Hello!</s>[INST] Be brief.\n\nBye[/INST]"


def test_tools_are_rendered_with_hf_tojson_unescaped_and_non_ascii():
    tools = [{"type": "function", "function": {"name": "weather", "description": "Wetter <heute> & 東京"}}]
    prompt = ChatTemplate(MISTRAL_LIKE).render([{"role": "user", "content": "?"}], tools=tools)
    expected_json = '[{"type": "function", "function": {"name": "weather", "description": "Wetter <heute> & 東京"}}]'
    assert prompt == f"[AVAILABLE_TOOLS]{expected_json}[/AVAILABLE_TOOLS][INST] ?[/INST]"


def test_tojson_supports_indent_and_keeps_key_order():
    template = ChatTemplate("{{ messages[0] | tojson(indent=2) }}")
    assert template.render([{"role": "user", "content": "é"}]) == '{\n  "role": "user",\n  "content": "é"\n}'


def test_extras_reach_the_template_and_may_override_special_tokens():
    template = ChatTemplate("{{ bos_token }}{% if enable_thinking %}<think>{% endif %}", bos_token="<s>")
    assert template.render([], enable_thinking=True) == "<s><think>"
    assert template.render([], bos_token="") == ""


def test_tools_and_documents_are_none_not_undefined():
    # HF always passes both; templates test them with `is not none`, which undefined would pass.
    template = ChatTemplate("{% if tools is not none %}T{% endif %}{% if documents is not none %}D{% endif %}")
    assert template.render([]) == ""


def test_loopcontrols_break_is_available():
    template = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}"
                            "{% endfor %}")
    assert template.render(CONVERSATION) == "Be brief."


def test_generation_block_renders_its_body():
    template = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}")
    assert template.render(CONVERSATION[:2]) == "[Be brief.][Hi]"


def test_strftime_now_formats_the_current_date():
    assert re.fullmatch(r"Today: \d{4}-\d{2}-\d{2}", ChatTemplate("Today: {{ strftime_now('%Y-%m-%d') }}").render([]))


# --- loading ------------------------------------------------------------------------------------

def _write_config(tmp_path, **config):
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_from_tokenizer_config_string_template(tmp_path):
    path = _write_config(tmp_path, chat_template=CHATML, bos_token="<s>", eos_token="<|im_end|>")
    template = ChatTemplate.from_tokenizer_config(path)
    assert (template.bos_token, template.eos_token) == ("<s>", "<|im_end|>")
    assert template.render([{"role": "user", "content": "Hi"}]).endswith("<|im_start|>user\nHi<|im_end|>\n"
                                                                         "<|im_start|>assistant\n")


def test_from_tokenizer_config_list_picks_default_or_named(tmp_path):
    path = _write_config(tmp_path, chat_template=[{"name": "tool_use", "template": "TOOLS"},
                                                  {"name": "default", "template": "DEFAULT"}])
    assert ChatTemplate.from_tokenizer_config(path).render([]) == "DEFAULT"
    assert ChatTemplate.from_tokenizer_config(path, name="tool_use").render([]) == "TOOLS"


def test_from_tokenizer_config_list_without_default_names_what_it_found(tmp_path):
    path = _write_config(tmp_path, chat_template=[{"name": "tool_use", "template": "TOOLS"}])
    with pytest.raises(ChatTemplateError, match=r"no template named 'default' \(found: tool_use\)"):
        ChatTemplate.from_tokenizer_config(path)


def test_from_tokenizer_config_reads_dict_shaped_special_tokens(tmp_path):
    added_token = {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}
    path = _write_config(tmp_path, chat_template=LLAMA2, bos_token=added_token,
                         eos_token={"__type": "AddedToken", "content": "</s>"})
    prompt = ChatTemplate.from_tokenizer_config(path).render(CONVERSATION[1:3])
    assert prompt == "<s>[INST] Hi [/INST] Hello! </s>"


def test_from_tokenizer_config_missing_special_tokens_render_empty(tmp_path):
    path = _write_config(tmp_path, chat_template="{{ bos_token }}|{{ eos_token }}", bos_token=None)
    assert ChatTemplate.from_tokenizer_config(path).render([]) == "|"


def test_from_tokenizer_config_without_template_is_an_error(tmp_path):
    path = _write_config(tmp_path, bos_token="<s>")
    with pytest.raises(ChatTemplateError, match="no chat_template"):
        ChatTemplate.from_tokenizer_config(path)


def test_from_tokenizer_config_falls_back_to_sibling_jinja_file(tmp_path):
    # Newer transformers save the template as chat_template.jinja beside the config.
    (tmp_path / "chat_template.jinja").write_text(CHATML_MULTILINE, encoding="utf-8")
    path = _write_config(tmp_path, eos_token="<|im_end|>")
    template = ChatTemplate.from_tokenizer_config(path)
    assert template.eos_token == "<|im_end|>"
    assert template.render([{"role": "user", "content": "Hi"}]) == ChatTemplate(CHATML).render(
        [{"role": "user", "content": "Hi"}])


def test_from_tokenizer_config_rejects_bad_json(tmp_path):
    path = tmp_path / "tokenizer_config.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ChatTemplateError, match="not valid JSON"):
        ChatTemplate.from_tokenizer_config(path)


def test_from_file_reads_a_jinja_template(tmp_path):
    path = tmp_path / "chat_template.jinja"
    path.write_text(CHATML, encoding="utf-8")
    assert ChatTemplate.from_file(path).render([{"role": "user", "content": "Hi"}]).startswith("<|im_start|>system")


def test_from_file_missing_is_a_chat_template_error(tmp_path):
    with pytest.raises(ChatTemplateError, match="cannot read chat template"):
        ChatTemplate.from_file(tmp_path / "absent.jinja")


# --- errors -------------------------------------------------------------------------------------

def test_syntax_error_is_reported_at_construction_with_line():
    with pytest.raises(ChatTemplateError, match=r"syntax error at line 2: .*endfor"):
        ChatTemplate("{% for m in messages %}\n{{ m.content }}")


def test_unknown_filter_is_reported_at_construction():
    with pytest.raises(ChatTemplateError, match="no_such_filter"):
        ChatTemplate("{{ messages | no_such_filter }}")


def test_runtime_error_in_template_is_wrapped():
    with pytest.raises(ChatTemplateError, match="failed to render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"role": "user", "content": "x"}])


def test_raise_exception_message_is_the_error_message():
    with pytest.raises(ChatTemplateError) as excinfo:
        ChatTemplate("{{ raise_exception('System role not supported') }}").render([])
    assert str(excinfo.value) == "System role not supported"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages['__class__'] }}",
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
])
def test_sandbox_blocks_access_to_internals(source):
    with pytest.raises(ChatTemplateError, match="unsafe") as excinfo:
        ChatTemplate(source).render([])
    assert isinstance(excinfo.value.__cause__, SecurityError)


def test_sandbox_blocks_mutating_the_callers_messages():
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ChatTemplateError) as excinfo:
        ChatTemplate("{{ messages.append({'role': 'system'}) }}").render(messages)
    assert isinstance(excinfo.value.__cause__, SecurityError)
    assert messages == [{"role": "user", "content": "Hi"}]


# --- render_prompt ------------------------------------------------------------------------------

def test_render_prompt_without_template_passes_plain_input_unchanged():
    assert render_prompt([{"role": "user", "content": " raw\n"}], None, " raw\n") == " raw\n"


def test_render_prompt_with_template_renders_even_when_plain_input_exists():
    messages = [{"role": "user", "content": "Hi"}]
    assert render_prompt(messages, ChatTemplate(CHATML), "Hi") == ChatTemplate(CHATML).render(messages)


def test_render_prompt_without_template_or_plain_input_says_how_to_fix():
    with pytest.raises(ChatTemplateError, match=r"model has no chat template: .*configure chat_template or send input"):
        render_prompt([{"role": "user", "content": "Hi"}], None, None)
