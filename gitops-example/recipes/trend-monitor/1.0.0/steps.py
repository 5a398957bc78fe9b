"""trend-monitor 1.0.0: three independent analyses of a batch of posts, then a summary.

topics, mood and mentions have no dependencies: the runner runs them concurrently (and
topics and mood classify their posts concurrently, one `llm.classify` call per post, with the
labels and keywords of the step's params). summary counts what they found, asks the model to
write the report (the drafted report is the prompt's last line, which is also what the
offline MockBackend answers), streams it with `ctx.stream` and returns it with the counts.
"""

import asyncio
import re
from collections import Counter

HANDLE = re.compile(r"(?<![\w@])@(\w{1,30})")
HASHTAG = re.compile(r"(?<![\w#])#(\w{1,50})")


def _literal(text):
    """`text` as a literal inside a prompt template (the tool renders the prompt once)."""
    return text.replace("{", "{{").replace("}", "}}")


def posts_of(inputs):
    posts = inputs.get("posts", [])
    if isinstance(posts, str):
        posts = posts.splitlines()
    if not isinstance(posts, list) or not all(isinstance(post, str) for post in posts):
        raise ValueError("posts must be a list of strings (or one string, a post per line)")
    return [post.strip() for post in posts if post.strip()]


async def _classify_each(ctx):
    posts = posts_of(ctx.inputs)
    labels = await asyncio.gather(*(
        ctx.tools.call("llm.classify", input=post, labels=ctx.params["labels"], keywords=ctx.params["keywords"])
        for post in posts
    ))
    return {"labels": list(labels), "counts": _ranked(Counter(labels))}


def _ranked(counter):
    """{key: count}, most frequent first, ties by name: a stable order for reports and JSON."""
    return dict(sorted(counter.items(), key=lambda item: (-item[1], item[0])))


async def topics(ctx):
    return await _classify_each(ctx)


async def mood(ctx):
    return await _classify_each(ctx)


def mentions(ctx):
    posts = posts_of(ctx.inputs)
    handles = Counter("@" + h.lower() for post in posts for h in HANDLE.findall(post))
    tags = Counter("#" + t.lower() for post in posts for t in HASHTAG.findall(post))
    return {"handles": _ranked(handles), "hashtags": _ranked(tags)}


def _top(counts):
    return next(iter(counts.items()), (None, 0))


def report(n, topic_counts, mood_counts, found):
    if n == 0:
        return "No posts to summarise."
    topic, topic_n = _top(topic_counts)
    feeling, feeling_n = _top(mood_counts)
    plural = "post" if n == 1 else "posts"
    parts = [f"{n} {plural}: mostly about {topic} ({topic_n} of {n}), mood mostly {feeling} ({feeling_n} of {n})."]
    handle, handle_n = _top(found["handles"])
    tag, tag_n = _top(found["hashtags"])
    extras = []
    if handle:
        extras.append(f"most mentioned {handle} ({handle_n})")
    if tag:
        extras.append(f"top hashtag {tag} ({tag_n})")
    if extras:
        parts.append(" and ".join(extras).capitalize() + ".")
    return " ".join(parts)


async def summary(ctx):
    n = len(posts_of(ctx.inputs))
    topic_counts, mood_counts = ctx.results["topics"]["counts"], ctx.results["mood"]["counts"]
    found = ctx.results["mentions"]
    prompt = ctx.params["prompt"] + "\n" + _literal(report(n, topic_counts, mood_counts, found))
    text = "".join([token async for token in ctx.stream("llm.generate", prompt=prompt)])
    return {
        "summary": text.strip(),
        "posts": n,
        "topics": topic_counts,
        "mood": mood_counts,
        "mentions": found["handles"],
        "hashtags": found["hashtags"],
    }


def chat_inputs(messages):
    """Inputs for a chat call (the runner's /chat): the last user message holds the posts, one
    per line."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
            if not isinstance(content, str) or not content.strip():
                raise ValueError("the last user message has no text (it holds the posts, one per line)")
            return {"posts": [line.strip() for line in content.splitlines() if line.strip()]}
    raise ValueError("no user message (it holds the posts, one per line)")
