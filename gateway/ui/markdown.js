// The Markdown subset plnt's plan comments use (reconciler/plan/diff.py render_markdown,
// reconciler/review/plan_review.py render_comment), rendered to DOM nodes: headings, paragraphs, pipe tables
// (with `\|` inside cells), fenced code blocks, `code`, **bold** and <br>. Every piece of text goes
// in through textContent/createTextNode: nothing is parsed as HTML, so a spec value cannot inject markup.

function inline(text, parent) {
  let plain = "";
  const flush = () => { if (plain) { parent.appendChild(document.createTextNode(plain)); plain = ""; } };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "`") {
      const end = text.indexOf("`", i + 1);
      if (end > i) {
        flush();
        const code = document.createElement("code");
        code.textContent = text.slice(i + 1, end);
        parent.appendChild(code);
        i = end + 1;
        continue;
      }
    } else if (c === "*" && text.startsWith("**", i)) {
      const end = text.indexOf("**", i + 2);
      if (end > i + 2) {
        flush();
        const strong = document.createElement("strong");
        inline(text.slice(i + 2, end), strong);
        parent.appendChild(strong);
        i = end + 2;
        continue;
      }
    } else if (c === "<" && /^<br\s*\/?>/i.test(text.slice(i, i + 6))) {
      flush();
      parent.appendChild(document.createElement("br"));
      i = text.indexOf(">", i) + 1;
      continue;
    } else if (c === "\\" && i + 1 < text.length && /[\\`*_{}\[\]()#+\-.!|<>~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    plain += c;
    i += 1;
  }
  flush();
  return parent;
}

function cells(line) {
  let body = line.trim();
  if (body.startsWith("|")) body = body.slice(1);
  if (body.endsWith("|") && !body.endsWith("\\|")) body = body.slice(0, -1);
  const out = [];
  let cell = "";
  for (let i = 0; i < body.length; i += 1) {
    if (body[i] === "\\" && body[i + 1] === "|") { cell += "|"; i += 1; continue; }
    if (body[i] === "|") { out.push(cell.trim()); cell = ""; continue; }
    cell += body[i];
  }
  out.push(cell.trim());
  return out;
}

const SEPARATOR = /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/;

// Markdown text -> a <div class="md"> element.
export function renderMarkdown(markdown) {
  const root = document.createElement("div");
  root.className = "md";
  const lines = String(markdown || "").split(/\r\n|\r|\n/);
  let paragraph = [];
  const endParagraph = () => {
    if (paragraph.length) {
      root.appendChild(inline(paragraph.join(" "), document.createElement("p")));
      paragraph = [];
    }
  };
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i];
    if (/^```/.test(line)) {
      endParagraph();
      const pre = document.createElement("pre");
      const code = document.createElement("code");
      const body = [];
      for (i += 1; i < lines.length && !/^```/.test(lines[i]); i += 1) body.push(lines[i]);
      code.textContent = body.join("\n");
      pre.appendChild(code);
      root.appendChild(pre);
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      endParagraph();
      const level = Math.min(6, Math.max(2, heading[1].length));
      root.appendChild(inline(heading[2], document.createElement(`h${level}`)));
      continue;
    }
    if (line.trim().startsWith("|") && i + 1 < lines.length && SEPARATOR.test(lines[i + 1])) {
      endParagraph();
      const table = document.createElement("table");
      const head = cells(line);
      const thead = table.createTHead().insertRow();
      for (const cell of head) {
        const th = document.createElement("th");
        th.scope = "col";
        inline(cell, th);
        thead.appendChild(th);
      }
      const tbody = table.createTBody();
      for (i += 2; i < lines.length && lines[i].trim().startsWith("|"); i += 1) {
        const row = tbody.insertRow();
        const values = cells(lines[i]);
        for (let c = 0; c < head.length; c += 1) inline(values[c] || "", row.insertCell());
      }
      i -= 1;
      root.appendChild(table);
      continue;
    }
    if (line.trim() === "") { endParagraph(); continue; }
    paragraph.push(line.trim());
  }
  endParagraph();
  return root;
}
