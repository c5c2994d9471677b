"""llama.cpp's built-in chat templates that write each message on its own: one format per role.

llama-server formats a chat with `--chat-template NAME` (a name from `LLM_CHAT_TEMPLATES`) by
`llm_chat_apply_template` in src/llama-chat.cpp: hand-written C++, not Jinja. Most of its branches
only write every message through a per-role pattern and add a generation prompt; those are this
table, transcribed from that function (llama.cpp as vendored in llama-cpp-python 0.3.36, the
peer the suite measures against). The branches that carry state from one message to the next
(system prompts merged later, turns that open and close) are functions in builtin_templates.py.

A pattern is a `str.format` string over the message's fields:
- `{role}`, `{content}`: as sent; `{trimmed}`: the content with ASCII whitespace cut from both
  ends (the C++ `trim`, whose `isspace` knows no Unicode spaces);
- `{ROLE}`: Bailing's role, `HUMAN` for `user`, else the role in ASCII capitals (`::toupper`);
- `{Role}`: OpenChat's role, its first byte in capitals (`role[0] = toupper(role[0])`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ASCII_SPACE = " \t\n\v\f\r"   # what C's isspace() accepts in the "C" locale


def trim(text: str) -> str:
    """llama-chat.cpp's `trim`: ASCII whitespace only, so U+00A0 or U+3000 stay, as in the C++."""
    return text.strip(ASCII_SPACE)


def ascii_upper(text: str) -> str:
    """C's toupper over bytes: only a-z change (str.upper would turn 'ß' into 'SS')."""
    return text.encode("utf-8", "surrogatepass").upper().decode("utf-8", "surrogatepass")


def _fields(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content, "trimmed": trim(content),
            "ROLE": "HUMAN" if role == "user" else ascii_upper(role),
            "Role": ascii_upper(role[:1]) + role[1:]}


@dataclass(frozen=True)
class Turns:
    """A template that writes message after message, each by its role's pattern.

    `turns`: role -> pattern; the key None is every other role; a role with no pattern (and no
    None key) writes nothing, as the C++ `if/else if` chains without an `else` do. `gen`: the
    generation prompt (`add_ass`). `head`: written first. `head_unless_system`: written first when
    the first message is not a system one (Bailing 2, Pangu). `first_system`: the pattern of a
    system message at index 0, when the C++ treats that one apart (GigaChat, Hunyuan)."""

    turns: dict[str | None, str]
    gen: str = ""
    head: str = ""
    head_unless_system: str = ""
    first_system: str | None = field(default=None)

    def pattern(self, index: int, role: str) -> str | None:
        """The pattern that writes message `index`, or None when the C++ skips it."""
        if index == 0 and role == "system" and self.first_system is not None:
            return self.first_system
        return self.turns.get(role, self.turns.get(None))

    def apply(self, chat: list[tuple[str, str]], add_ass: bool) -> str:
        """The prompt for `chat` ((role, content) pairs, at least one), as the C++ writes it."""
        out = [self.head, self.head_unless_system if chat[0][0] != "system" else ""]
        for i, (role, content) in enumerate(chat):
            pattern = self.pattern(i, role)
            if pattern is not None:
                out.append(pattern.format(**_fields(role, content)))
        if add_ass:
            out.append(self.gen)
        return "".join(out)


def _mistral_v7(space: str) -> Turns:
    return Turns({"system": f"[SYSTEM_PROMPT]{space}{{content}}[/SYSTEM_PROMPT]",
                  "user": f"[INST]{space}{{content}}[/INST]", None: f"{space}{{content}}</s>"})


def _vicuna(system: str) -> Turns:
    return Turns({"system": system, "user": "USER: {content}\n", "assistant": "ASSISTANT: {content}</s>\n"},
                 gen="ASSISTANT:")


def _exaone(tool: bool) -> Turns:
    turns = {"system": "[|system|]{trimmed}[|endofturn|]\n", "user": "[|user|]{trimmed}\n",
             "assistant": "[|assistant|]{trimmed}[|endofturn|]\n"}
    if tool:
        turns["tool"] = "[|tool|]{trimmed}[|endofturn|]\n"
    return Turns(turns, gen="[|assistant|]")


def _granite(tool_call_role: str) -> Turns:
    return Turns({"assistant_tool_call": f"<|start_of_role|>{tool_call_role}<|end_of_role|><|tool_call|>"
                                         "{content}<|end_of_text|>\n",
                  None: "<|start_of_role|>{role}<|end_of_role|>{content}<|end_of_text|>\n"},
                 gen="<|start_of_role|>assistant<|end_of_role|>")


_COMMAND_R = "<|START_OF_TURN_TOKEN|><|{}_TOKEN|>{{trimmed}}<|END_OF_TURN_TOKEN|>"
_DS_EOS = "<｜end▁of▁sentence｜>"
_HY_SYSTEM = "{content}<｜hy_place▁holder▁no▁3｜>"
_PANGU = "[unused9]{}：{{content}}[unused10]"

TURNS: dict[str, Turns] = {
    "chatml": Turns({None: "<|im_start|>{role}\n{content}<|im_end|>\n"}, gen="<|im_start|>assistant\n"),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": Turns({None: "<|{role}|>\n{content}<|end|>\n"}, gen="<|assistant|>\n"),
    "phi4": Turns({None: "<|im_start|>{role}<|im_sep|>{content}<|im_end|>"}, gen="<|im_start|>assistant<|im_sep|>"),
    "falcon3": Turns({None: "<|{role}|>\n{content}\n"}, gen="<|assistant|>\n"),
    "zephyr": Turns({None: "<|{role}|>\n{content}<|endoftext|>\n"}, gen="<|assistant|>\n"),
    "openchat": Turns({"system": "{content}<|end_of_turn|>", None: "GPT4 Correct {Role}: {content}<|end_of_turn|>"},
                      gen="GPT4 Correct Assistant:"),
    "vicuna": _vicuna("{content}\n\n"),
    "vicuna-orca": _vicuna("SYSTEM: {content}\n"),
    "deepseek": Turns({"system": "{content}", "user": "### Instruction:\n{content}\n",
                       "assistant": "### Response:\n{content}\n<|EOT|>\n"}, gen="### Response:\n"),
    "command-r": Turns({"system": _COMMAND_R.format("SYSTEM"), "user": _COMMAND_R.format("USER"),
                        "assistant": _COMMAND_R.format("CHATBOT")}, gen="<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": Turns({None: "<|start_header_id|>{role}<|end_header_id|>\n\n{trimmed}<|eot_id|>"},
                    gen="<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatglm3": Turns({None: "<|{role}|>\n {content}"}, gen="<|assistant|>", head="[gMASK]sop"),
    "chatglm4": Turns({None: "<|{role}|>\n{content}"}, gen="<|assistant|>\n", head="[gMASK]<sop>"),
    "glmedge": Turns({None: "<|{role}|>\n{content}"}, gen="<|assistant|>"),
    "minicpm": Turns({"user": "<用户>{trimmed}<AI>", None: "{trimmed}"}),
    "deepseek2": Turns({"system": "{content}\n\n", "user": "User: {content}\n\n",
                        "assistant": "Assistant: {content}" + _DS_EOS}, gen="Assistant:"),
    "deepseek3": Turns({"system": "{content}\n\n", "user": "<｜User｜>{content}",
                        "assistant": "<｜Assistant｜>{content}" + _DS_EOS}, gen="<｜Assistant｜>"),
    "deepseek-ocr": Turns({None: "{content}"}),
    "exaone3": _exaone(tool=False),
    "exaone4": _exaone(tool=True),
    "exaone-moe": Turns({r: f"<|{r}|>\n{{trimmed}}<|endofturn|>\n" for r in ("system", "user", "assistant", "tool")},
                        gen="<|assistant|>\n"),
    "granite": _granite("assistant_tool_call"),
    "granite-4.0": _granite("assistant"),
    "granite-4.1": _granite("assistant"),
    "gigachat": Turns({"user": "user<|role_sep|>{content}<|message_sep|>"
                               "available functions<|role_sep|>[]<|message_sep|>",
                       "assistant": "assistant<|role_sep|>{content}<|message_sep|>"},
                      gen="assistant<|role_sep|>", head="<s>", first_system="{content}<|message_sep|>"),
    "megrez": Turns({None: "<|role_start|>{role}<|role_end|>{content}<|turn_end|>"},
                    gen="<|role_start|>assistant<|role_end|>"),
    "yandex": Turns({"user": " Пользователь: {content}\n\n", "assistant": " Ассистент: {content}\n\n"},
                    gen=" Ассистент:[SEP]"),
    "bailing": Turns({None: "<role>{ROLE}</role>{content}"}, gen="<role>ASSISTANT</role>"),
    "bailing-think": Turns({None: "<role>{ROLE}</role>{content}"}, gen="<role>ASSISTANT</role><think>"),
    "bailing2": Turns({None: "<role>{ROLE}</role>{content}<|role_end|>"}, gen="<role>ASSISTANT</role>",
                      head_unless_system="<role>SYSTEM</role>detailed thinking off<|role_end|>"),
    "llama4": Turns({None: "<|header_start|>{role}<|header_end|>\n\n{trimmed}<|eot|>"},
                    gen="<|header_start|>assistant<|header_end|>\n\n"),
    "smolvlm": Turns({"system": "{content}\n\n", "user": "User: {content}<end_of_utterance>\n",
                      None: "Assistant: {content}<end_of_utterance>\n"}, gen="Assistant:", head="<|im_start|>"),
    "hunyuan-moe": Turns({"system": "<|startoftext|>{content}<|extra_4|>", "assistant": "{content}<|eos|>",
                          None: "<|startoftext|>{content}<|extra_0|>"}),
    "gpt-oss": Turns({"assistant": "<|start|>assistant<|message|>{content}<|return|>",
                      None: "<|start|>{role}<|message|>{content}<|end|>"}, gen="<|start|>assistant"),
    "hunyuan-dense": Turns({"assistant": "<｜hy_Assistant｜>{content}<｜hy_place▁holder▁no▁2｜>",
                            "user": "<｜hy_User｜>{content}<｜hy_Assistant｜>"}, first_system=_HY_SYSTEM),
    "hunyuan-vl": Turns({"user": "{content}<｜hy_User｜>", "assistant": "{content}<｜hy_Assistant｜>"},
                        head="<｜hy_begin▁of▁sentence｜>", first_system=_HY_SYSTEM),
    "kimi-k2": Turns({"system": "<|im_system|>system<|im_middle|>{content}<|im_end|>",
                      "user": "<|im_user|>user<|im_middle|>{content}<|im_end|>",
                      "assistant": "<|im_assistant|>assistant<|im_middle|>{content}<|im_end|>",
                      "tool": "<|im_system|>tool<|im_middle|>{content}<|im_end|>", None: "{content}<|im_end|>"},
                     gen="<|im_assistant|>assistant<|im_middle|>"),
    "seed_oss": Turns({"assistant": "<seed:bos>assistant\n{trimmed}<seed:eos>",
                       None: "<seed:bos>{role}\n{content}<seed:eos>"},
                      gen="<seed:bos>assistant\n"),
    "grok-2": Turns({"system": "System: {trimmed}<|separator|>\n\n", "user": "Human: {trimmed}<|separator|>\n\n",
                     "assistant": "Assistant: {content}<|separator|>\n\n"}, gen="Assistant:"),
    "pangu-embedded": Turns({"system": _PANGU.format("系统"), "user": _PANGU.format("用户"),
                             "assistant": _PANGU.format("助手"), "tool": _PANGU.format("工具"),
                             "function": _PANGU.format("方法")},
                            gen="[unused9]助手：", head_unless_system="[unused9]系统：[unused10]"),
    "solar-open": Turns({None: "<|begin|>{role}<|content|>{content}<|end|>"}, gen="<|begin|>assistant"),
}
