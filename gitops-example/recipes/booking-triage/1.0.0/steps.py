"""booking-triage 1.0.0: the decision rules and the reply.

intent (llm.classify) and policy (rag.query) have no dependencies, so they run concurrently.
decision applies the booking rules to the intent and the request (party size, how soon);
reply builds the answer from the decision, asks the model to polish it (the draft is the
prompt's last line, which is also what the offline MockBackend answers), streams it with
`ctx.stream`, and returns the structured triage with the polished reply.
"""

import re

GROUP_LIMIT = 8  # larger parties need a deposit: the team confirms by hand
SOON = re.compile(r"\b(today|tonight|tomorrow|this evening|in an hour|in two hours)\b", re.I)
PARTY = re.compile(r"\b(?:party of|table for|for)\s+(\d+)\b|\b(\d+)\s+(?:people|guests|persons|adults|of us)\b", re.I)
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10, "twelve": 12}


def _literal(text):
    """`text` as a literal inside a prompt template (the tool renders the prompt once)."""
    return text.replace("{", "{{").replace("}", "}}")


def party_size(request):
    """The number of guests the request names, if any ("table for 4", "we are now 12 people")."""
    text = re.sub(r"\b(" + "|".join(WORDS) + r")\b", lambda m: str(WORDS[m.group(1).lower()]), request, flags=re.I)
    match = PARTY.search(text)
    return int(match.group(1) or match.group(2)) if match else None


def decision(ctx):
    intent = ctx.results["intent"]
    request = str(ctx.inputs.get("request", ""))
    size = party_size(request)
    soon = bool(SOON.search(request))
    big = size is not None and size > GROUP_LIMIT
    if intent == "cancel":
        action, reason = ("escalate", "cancellation within 24 hours") if soon else ("approve", "free cancellation")
    elif intent == "change":
        if big:
            action, reason = "escalate", f"group of more than {GROUP_LIMIT} needs a deposit"
        elif soon:
            action, reason = "escalate", "change within 24 hours"
        else:
            action, reason = "approve", "free change"
    elif intent == "new_booking":
        action, reason = ("escalate", f"group of more than {GROUP_LIMIT} needs a deposit") if big else ("approve", "table available on request")
    elif intent == "complaint":
        action, reason = "escalate", "complaint for the manager"
    else:
        action, reason = "answer", "question about our policies"
    return {"action": action, "reason": reason, "partySize": size}


def _policy_answer(policies):
    """The first sentence of the best policy paragraph, without its "Topic:" label."""
    if not policies:
        return "Our team will get back to you with the details shortly."
    text = " ".join(policies[0].split())
    text = re.sub(r"^[A-Z][\w ]*:\s*", "", text)
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return first[:1].upper() + first[1:]


def draft(intent, decided, policies):
    action, size = decided["action"], decided["partySize"]
    if intent == "cancel":
        if action == "approve":
            return "Your booking is cancelled, free of charge. We hope to welcome you another time."
        return "We have your cancellation. As it is within 24 hours of your booking, our team will confirm it with you shortly."
    if intent == "change":
        if action == "approve":
            return "Your booking has been changed as requested. See you soon!"
        if "deposit" in decided["reason"]:
            return f"Thanks for letting us know. For groups of more than {GROUP_LIMIT} we ask for a deposit, so our team will contact you to confirm the change."
        return "Thanks for letting us know. As it is within 24 hours of your booking, our team will confirm the change with you shortly."
    if intent == "new_booking":
        if action == "approve":
            return f"Thank you! We have noted your table for {size}; you will receive a confirmation shortly." if size else (
                "Thank you! We have noted your booking; you will receive a confirmation shortly.")
        return f"Thank you! For groups of more than {GROUP_LIMIT} we ask for a deposit; our team will contact you to confirm your table for {size}."
    if intent == "complaint":
        return "We are very sorry to hear this. Our manager will contact you personally today."
    return f"Thanks for asking! {_policy_answer(policies)}"


async def reply(ctx):
    intent, decided = ctx.results["intent"], ctx.results["decision"]
    prompt = ctx.params["prompt"] + "\n" + _literal(draft(intent, decided, ctx.results["policy"]))
    text = "".join([token async for token in ctx.stream("llm.generate", prompt=prompt)])
    return {"reply": text.strip(), "intent": intent, **decided}


def chat_inputs(messages):
    """Inputs for a chat call (the runner's /chat): the last user message is the request."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
            if not isinstance(content, str) or not content.strip():
                raise ValueError("the last user message has no text (it is the booking request)")
            return {"request": content.strip()}
    raise ValueError("no user message (it is the booking request)")
