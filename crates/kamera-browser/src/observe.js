// Compact page text with element ids. Returns a JSON string {title, url, text, elements}.
(() => {
  const out = [];
  const elements = [];
  let next = 1;
  const INTERACTIVE = new Set(['a', 'button', 'input', 'select', 'textarea', 'option', 'label']);
  const SKIP = new Set(['script', 'style', 'noscript', 'template', 'head', 'svg']);
  const BLOCK = 'a,button,input,select,textarea,label,div,p,table,ul,ol,li,form,h1,h2,h3,h4,br,svg,canvas,[onclick],[role=button]';
  const clip = (s, n) => { s = (s || '').replace(/\s+/g, ' ').trim(); return s.length > n ? s.slice(0, n - 1) + '…' : s; };
  const visible = (el) => {
    const st = getComputedStyle(el);
    if (st.display === 'none' || st.visibility === 'hidden' || Number(st.opacity) === 0) return false;
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  const interactive = (el) => {
    const t = el.tagName.toLowerCase();
    if (t === 'label' || t === 'option') return false;
    return INTERACTIVE.has(t) || el.hasAttribute('onclick') || el.getAttribute('role') === 'button' ||
      (el.id && el.id.length > 0 && ['subbtn', 'sync-task-cover'].includes(el.id));
  };
  const walk = (el, depth) => {
    const tag = el.tagName.toLowerCase();
    if (SKIP.has(tag) || !visible(el)) return;
    if (interactive(el)) {
      const id = next++;
      el.setAttribute('data-kid', String(id));
      const r = el.getBoundingClientRect();
      let text = '';
      if (tag === 'input' || tag === 'textarea') {
        text = el.value || el.placeholder || '';
      } else if (tag === 'select') {
        text = el.options[el.selectedIndex] ? el.options[el.selectedIndex].text : '';
      } else {
        text = el.innerText || el.value || el.getAttribute('aria-label') || el.title || '';
      }
      text = clip(text, 80);
      const type = tag === 'input' ? ` type=${el.type}` : '';
      out.push(`[${id}] ${tag}${type} "${text}"`);
      elements.push({ id, tag, html_id: el.id || '', text, href: tag === 'a' ? (el.getAttribute('href') || '') : '',
        x: r.left + r.width / 2, y: r.top + r.height / 2 });
      return;
    }
    if (tag === 'tr') {
      const cells = Array.from(el.children).filter(visible).map((c) => {
        const inner = c.querySelector('a,button,input');
        if (inner) { walk(inner, depth + 1); return out.pop(); }
        return clip(c.innerText, 60);
      });
      out.push(cells.join(' | '));
      return;
    }
    let own = '';
    for (const n of el.childNodes) if (n.nodeType === 3) own += n.textContent;
    own = clip(own, 200);
    if (own && !el.querySelector(BLOCK)) {
      // Text with only inline children (spans, bold): one line, read as a whole.
      const all = clip(el.innerText, 240);
      out.push(/^h[1-6]$/.test(tag) ? '# ' + all : all);
      return;
    }
    if (own) out.push(/^h[1-6]$/.test(tag) ? '# ' + own : own);
    for (const c of el.children) walk(c, depth + 1);
  };
  document.querySelectorAll('[data-kid]').forEach((e) => e.removeAttribute('data-kid'));
  if (document.body) walk(document.body, 0);
  return JSON.stringify({ title: document.title, url: location.href, text: out.join('\n'), elements });
})()
