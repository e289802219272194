// Compact page text with element ids. Returns a JSON string {title, url, text, elements}.
// Interactive elements (links, buttons, form controls, ARIA widget roles, click handlers,
// cursor: pointer, tabindex, contenteditable) are listed as `[id] tag "text"`; other visible
// elements with their own text get ids too, unlisted, so `text:` targets can match them.
(() => {
  const out = [];
  const elements = [];
  let next = 1;
  const CONTROLS = new Set(['a', 'button', 'input', 'select', 'textarea', 'summary']);
  const ROLES = new Set(['button', 'link', 'tab', 'menuitem', 'menuitemcheckbox', 'menuitemradio', 'option',
    'checkbox', 'radio', 'switch', 'treeitem', 'combobox', 'textbox', 'searchbox', 'slider', 'spinbutton', 'gridcell']);
  const TEXTLIKE = new Set(['text', 'search', 'email', 'password', 'tel', 'url', 'number', 'date', 'time', 'datetime-local', 'month', 'week']);
  const SKIP = new Set(['script', 'style', 'noscript', 'template', 'head', 'svg']);
  const BLOCK = 'a,button,input,select,textarea,label,div,p,table,ul,ol,li,form,h1,h2,h3,h4,br,svg,canvas,[onclick],[role],[tabindex]';
  const hooked = window.__kameraClickable;
  const clip = (s, n) => { s = (s || '').replace(/\s+/g, ' ').trim(); return s.length > n ? s.slice(0, n - 1) + '…' : s; };
  const visible = (el) => {
    const st = getComputedStyle(el);
    if (st.display === 'none' || st.visibility === 'hidden' || Number(st.opacity) === 0) return false;
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  const role = (el) => (el.getAttribute('role') || '').trim().toLowerCase();
  // Links, buttons, form controls, ARIA widgets: always interactive.
  const strong = (el, tag) => {
    if (CONTROLS.has(tag)) return !(tag === 'input' && el.type === 'hidden') && !(tag === 'a' && !el.hasAttribute('href') && !weak(el));
    return ROLES.has(role(el)) || el.hasAttribute('onclick') || el.isContentEditable && !el.parentElement.isContentEditable;
  };
  // Signals of a custom control: a click listener, the pointer cursor (where it starts, not
  // inherited), a tabindex. They count only on elements with no interactive descendant.
  const weak = (el) => {
    const tab = el.getAttribute('tabindex');
    if (tab !== null && Number(tab) >= 0) return true;
    if (hooked && hooked.has(el)) return true;
    const p = el.parentElement;
    return getComputedStyle(el).cursor === 'pointer' && !(p && getComputedStyle(p).cursor === 'pointer');
  };
  const interactive = (el, tag) => {
    if (tag === 'label' || tag === 'option' || tag === 'body' || tag === 'html') return false;
    if (strong(el, tag)) return true;
    if (!weak(el)) return false;
    const inner = el.getElementsByTagName('*');
    if (inner.length > 60) return false;
    for (const d of inner) if (strong(d, d.tagName.toLowerCase()) || (hooked && hooked.has(d))) return false;
    return true;
  };
  const describe = (el, tag) => {
    if (tag === 'input' && (el.type === 'checkbox' || el.type === 'radio')) {
      const lab = el.labels && el.labels[0] ? el.labels[0].innerText : '';
      return [lab || el.getAttribute('aria-label') || el.value || '', el.checked ? ' checked' : ''];
    }
    if (tag === 'input' || tag === 'textarea') return [el.value || el.placeholder || el.getAttribute('aria-label') || '', ''];
    if (tag === 'select') {
      const o = el.options[el.selectedIndex];
      const all = Array.from(el.options).map((x) => clip(x.text, 30)).join(' | ');
      return [o ? o.text : '', ` options: ${clip(all, 200)}`];
    }
    const r = role(el);
    const state = (r === 'checkbox' || r === 'radio' || r === 'switch') && el.getAttribute('aria-checked') === 'true' ? ' checked'
      : el.getAttribute('aria-selected') === 'true' ? ' selected' : '';
    return [el.innerText || el.value || el.getAttribute('aria-label') || el.title || '', state];
  };
  const walk = (el, depth) => {
    const tag = el.tagName.toLowerCase();
    if (SKIP.has(tag) || !visible(el)) return;
    if (interactive(el, tag)) {
      const id = next++;
      el.setAttribute('data-kid', String(id));
      const r = el.getBoundingClientRect();
      const [raw, state] = describe(el, tag);
      const text = clip(raw, 80);
      const type = tag === 'input' ? ` type=${el.type}` : '';
      const rl = role(el);
      const roleText = rl && rl !== tag ? ` role=${rl}` : '';
      out.push(`[${id}] ${tag}${type}${roleText} "${text}"${state}`);
      const checkable = (tag === 'input' && (el.type === 'checkbox' || el.type === 'radio')) || ['checkbox', 'radio', 'switch', 'menuitemcheckbox'].includes(rl);
      const checked = !checkable ? null : tag === 'input' ? el.checked : el.getAttribute('aria-checked') === 'true';
      const options = tag === 'select' ? Array.from(el.options).slice(0, 50).map((o) => clip(o.text, 60)) : [];
      const editable = (tag === 'input' && TEXTLIKE.has(el.type)) || tag === 'textarea' || el.isContentEditable ||
        ['textbox', 'searchbox', 'combobox'].includes(rl);
      elements.push({ id, tag, role: rl, html_id: el.id || '', text, checked, options, editable,
        href: tag === 'a' ? (el.getAttribute('href') || '') : '', x: r.left + r.width / 2, y: r.top + r.height / 2 });
      return;
    }
    if (tag === 'tr') {
      const cells = Array.from(el.children).filter(visible).map((c) => {
        const inner = c.querySelector('a,button,input,select');
        if (inner) { walk(inner, depth + 1); return out.pop(); }
        return clip(c.innerText, 60);
      });
      out.push(cells.join(' | '));
      return;
    }
    let own = '';
    for (const n of el.childNodes) if (n.nodeType === 3) own += n.textContent;
    own = clip(own, 200);
    const inline = () => {
      if (el.querySelector(BLOCK)) return false;
      const ds = el.getElementsByTagName('*');
      if (ds.length > 100) return false;
      for (const d of ds) if (interactive(d, d.tagName.toLowerCase())) return false;
      return true;
    };
    if (own && inline()) {
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
  // Visible elements with their own text that are not listed: ids for `text:` targets.
  if (document.body) {
    for (const el of document.body.querySelectorAll('*')) {
      if (elements.length >= 600) break;
      const tag = el.tagName.toLowerCase();
      if (SKIP.has(tag) || el.hasAttribute('data-kid') || el.closest('svg')) continue;
      let own = '';
      for (const n of el.childNodes) if (n.nodeType === 3) own += n.textContent;
      if (!own.trim() || !visible(el)) continue;
      const id = next++;
      el.setAttribute('data-kid', String(id));
      const r = el.getBoundingClientRect();
      elements.push({ id, tag, role: role(el), html_id: el.id || '', text: clip(el.innerText, 80), href: '',
        x: r.left + r.width / 2, y: r.top + r.height / 2, interactive: false });
    }
  }
  return JSON.stringify({ title: document.title, url: location.href, text: out.join('\n'), elements });
})()
