"""post-generator 1.0.0: the steps that need more than their default tool binding.

style, outline and moderation use their bindings as configured in workflow.yaml. post builds
a draft from the outline and the audience's hashtags (from the retrieved style notes), asks
the model to write the post from it (the draft is the prompt's last line, which is also what
the offline MockBackend answers) and streams it: `ctx.stream` sends each token to a
streaming client as it is produced. A topic the moderation step blocks gets a refusal.
"""

import re

REFUSAL = "Sorry, I can't write this post: the topic goes against our content policy ({words})."
MIDDLE = "Start small, stay consistent and share what you learn."


def _literal(text):
    """`text` as a literal inside a prompt template (the tool renders the prompt once)."""
    return text.replace("{", "{{").replace("}", "}}")


def _hashtags(style_notes):
    """The hashtags of the best-matching style note that lists some ("Hashtags: #A #B")."""
    for note in style_notes:
        match = re.search(r"Hashtags:\s*((?:#\w+\s*)+)", note)
        if match:
            return " ".join(match.group(1).split()[:2])
    return ""


def _sentence(text):
    text = text.strip().rstrip(".!?")
    return text[:1].upper() + text[1:]


def draft(outline, style_notes, topic):
    """'hook. point? middle. call to action! #tags' from 'hook | point | call to action'."""
    parts = [part.strip() for part in outline.split("|") if part.strip()]
    if len(parts) >= 3:
        hook, point, call = parts[:3]
        text = f"{_sentence(hook)}. {_sentence(point)}? {MIDDLE} {_sentence(call)}!"
    else:  # a model that did not follow the outline format
        text = f"{_sentence(outline or topic)}. {MIDDLE}"
    tags = _hashtags(style_notes) or "#" + "".join(word.capitalize() for word in re.findall(r"\w+", topic))
    return f"{text} {tags}".strip()


async def post(ctx):
    verdict = ctx.results["moderation"]
    if not verdict["approved"]:
        words = ", ".join(reason.removeprefix("blocked word: ") for reason in verdict["reasons"])
        refusal = REFUSAL.format(words=words)
        ctx.emit(refusal)  # a streaming client sees the refusal too
        return refusal
    text = draft(ctx.results["outline"], ctx.results["style"], str(ctx.inputs.get("topic", "")))
    prompt = ctx.params["prompt"] + "\n" + _literal(text)
    tokens = [token async for token in ctx.stream("llm.generate", prompt=prompt)]
    return "".join(tokens).strip()


def chat_inputs(messages):
    """Inputs for a chat call (the runner's /chat): the last user message is the topic, for
    general readers."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
            if not isinstance(content, str) or not content.strip():
                raise ValueError("the last user message has no text (it is the topic of the post)")
            return {"topic": content.strip(), "audience": "general readers"}
    raise ValueError("no user message (it is the topic of the post)")
