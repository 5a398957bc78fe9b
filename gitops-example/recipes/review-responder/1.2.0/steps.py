"""review-responder 1.2.0: the steps that need more than their default tool binding.

classify_intent and retrieve_brand_voice use their bindings as configured in workflow.yaml.
draft_reply builds a draft from the intent, asks the model to polish it (the draft is the
prompt's last line, which is also what the offline MockBackend answers) and adds the
sign-off; safety_check moderates the reply and shapes the workflow's output.
"""

import re

SIGN_OFF = "— The Customer Care Team"

# (first sentence, follow-up); a "brief" brand voice keeps only the first.
DRAFTS = {
    "mixed": (
        "Thank you for your review! We're glad you enjoyed {good}, and we're sorry about {bad}.",
        "We've shared your feedback with the team so your next visit is even better.",
    ),
    "praise": ("Thank you so much for your review! We're delighted you enjoyed {good}.", "We can't wait to welcome you back."),
    "complaint": ("Thank you for telling us, and we're sorry about {bad}.", "We've passed this on to the team and we'll put it right."),
    "question": ("Thanks for your question! Our team will get back to you with the details shortly.", "We hope to see you soon."),
}
STOPWORDS = {"a", "an", "and", "the", "was", "were", "is", "but", "with", "of", "to", "our", "my"}


def _literal(text):
    """`text` as a literal inside a prompt template (the tool renders the prompt once)."""
    return text.replace("{", "{{").replace("}", "}}")


def _phrase(review: str, keywords: list[str]) -> str | None:
    """'the slow parking' for keyword 'slow' in 'Great service but slow parking'."""
    words = re.findall(r"[A-Za-z']+", review)
    for index, word in enumerate(words[:-1]):
        following = words[index + 1].lower()
        if word.lower() in keywords and following not in STOPWORDS:
            return f"the {word.lower()} {following}"
    return None


async def draft_reply(ctx):
    intent = ctx.results["classify_intent"]
    keywords = next(s.params["keywords"] for s in ctx.workflow.steps if s.id == "classify_intent")
    review = str(ctx.inputs.get("review", ""))
    good = _phrase(review, keywords["praise"]) or "your visit"
    bad = _phrase(review, keywords["complaint"]) or "what fell short"
    first, follow_up = DRAFTS.get(intent, DRAFTS["mixed"])
    draft = first.format(good=good, bad=bad)
    if "brief" not in str(ctx.inputs.get("brand_voice", "")).lower():
        draft = f"{draft} {follow_up}"
    prompt = ctx.params["prompt"] + "\n" + _literal(draft)
    polished = await ctx.tools.call("llm.generate", prompt=prompt)
    return f"{polished.strip()} {SIGN_OFF}"


async def safety_check(ctx):
    reply = ctx.results["draft_reply"]
    verdict = await ctx.tools.call("policy.moderate", text=reply)
    return {
        "reply": reply,
        "intent": ctx.results["classify_intent"],
        "approved": verdict["approved"],
        "reasons": verdict["reasons"],
        "version": ctx.workflow.metadata.version,
    }


def chat_inputs(messages):
    """Inputs for a chat call (the runner's /chat): the last user message is the review,
    answered in the default brand voice "warm, brief"."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
            if not isinstance(content, str) or not content.strip():
                raise ValueError("the last user message has no text (it is the review to answer)")
            return {"review": content, "brand_voice": "warm, brief"}
    raise ValueError("no user message (it is the review to answer)")
