// Compact page text with element ids. Returns a JSON string {title, url, text, elements}.
// Interactive elements (links, buttons, form controls, ARIA widget roles, click handlers,
// cursor: pointer, tabindex, contenteditable) are listed as `[id] tag "text"`; other visible
// elements with their own text get ids too, unlisted, so `text:` targets can match them.
// Open shadow roots and same-origin frames are walked as part of the page (ids stay unique, the
// positions are in the top viewport); a cross-origin frame is listed by its origin, not entered.
(() => {
  const out = [];
  const elements = [];
  let next = 1;
  const CONTROLS = new Set(['a', 'button', 'input', 'select', 'textarea', 'summary']);
  const ROLES = new Set(['button', 'link', 'tab', 'menuitem', 'menuitemcheckbox', 'menuitemradio', 'option',
    'checkbox', 'radio', 'switch', 'treeitem', 'combobox', 'textbox', 'searchbox', 'slider', 'spinbutton', 'gridcell']);
  const TEXTLIKE = new Set(['text', 'search', 'email', 'password', 'tel', 'url', 'number', 'date', 'time', 'datetime-local', 'month', 'week']);
  const SKIP = new Set(['script', 'style', 'noscript', 'template', 'head', 'svg']);
  const BLOCK = 'a,button,input,select,textarea,label,div,p,table,ul,ol,li,form,h1,h2,h3,h4,br,svg,canvas,iframe,frame,[onclick],[role],[tabindex]';
  // Styles and click hooks belong to each element's own window (a frame has its own).
  const getComputedStyle = (e) => e.ownerDocument.defaultView.getComputedStyle(e);
  const hookedOf = (e) => e.ownerDocument.defaultView.__kameraClickable;
  const hooked = { has: (e) => { const h = hookedOf(e); return !!h && h.has(e); } };
  const isFrame = (el) => el.tagName === 'IFRAME' || el.tagName === 'FRAME';
  // A same-origin frame's document (null for a cross-origin or sandboxed one).
  const frameDoc = (el) => { try { const d = el.contentDocument; return d && d.body ? d : null; } catch (_) { return null; } };
  // Where a frame's viewport sits in its parent's.
  const inset = (f, off) => { const r = f.getBoundingClientRect(); return { dx: off.dx + r.left + f.clientLeft, dy: off.dy + r.top + f.clientTop }; };
  const originOf = (f) => { try { return new URL(f.getAttribute('src') || 'about:blank', f.ownerDocument.baseURI).origin; } catch (_) { return 'null'; } };
  // Every tree the page shows, with its viewport offset: the document, open shadow roots, same-origin frames.
  const roots = [];
  const collect = (root, off) => {
    roots.push({ root, off });
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) collect(el.shadowRoot, off);
      if (isFrame(el)) { const d = frameDoc(el); if (d) collect(d, inset(el, off)); }
    }
  };
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
    return ROLES.has(role(el)) || el.hasAttribute('onclick') || el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable);
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
  const walk = (el, depth, off) => {
    const tag = el.tagName.toLowerCase();
    if (SKIP.has(tag) || !visible(el)) return;
    if (isFrame(el)) {
      const d = frameDoc(el);
      if (!d) { out.push(`frame ${originOf(el)} (cross-origin: not entered)`); return; }
      walk(d.body, depth + 1, inset(el, off));
      return;
    }
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
        href: tag === 'a' ? (el.getAttribute('href') || '') : '', x: off.dx + r.left + r.width / 2, y: off.dy + r.top + r.height / 2 });
      return;
    }
    if (tag === 'tr') {
      const cells = Array.from(el.children).filter(visible).map((c) => {
        const inner = c.querySelector('a,button,input,select');
        if (inner) { walk(inner, depth + 1, off); return out.pop(); }
        return clip(c.innerText, 60);
      });
      out.push(cells.join(' | '));
      return;
    }
    let own = '';
    for (const n of el.childNodes) if (n.nodeType === 3) own += n.textContent;
    own = clip(own, 200);
    const inline = () => {
      if (el.shadowRoot || el.querySelector(BLOCK)) return false;
      const ds = el.getElementsByTagName('*');
      if (ds.length > 100) return false;
      for (const d of ds) if (d.shadowRoot || interactive(d, d.tagName.toLowerCase())) return false;
      return true;
    };
    if (own && inline()) {
      // Text with only inline children (spans, bold): one line, read as a whole.
      const all = clip(el.innerText, 240);
      out.push(/^h[1-6]$/.test(tag) ? '# ' + all : all);
      return;
    }
    if (own) out.push(/^h[1-6]$/.test(tag) ? '# ' + own : own);
    // An open shadow root is rendered in place of the host's children (slotted ones aside).
    if (el.shadowRoot) for (const c of el.shadowRoot.children) walk(c, depth + 1, off);
    for (const c of el.children) walk(c, depth + 1, off);
  };
  const top = { dx: 0, dy: 0 };
  if (document.body) collect(document, top);
  for (const { root } of roots) root.querySelectorAll('[data-kid]').forEach((e) => e.removeAttribute('data-kid'));
  if (document.body) walk(document.body, 0, top);
  // Visible elements with their own text that are not listed: ids for `text:` targets.
  for (const { root, off } of roots) {
    const scope = root.body || root;
    for (const el of scope.querySelectorAll('*')) {
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
        x: off.dx + r.left + r.width / 2, y: off.dy + r.top + r.height / 2, interactive: false });
    }
  }
  return JSON.stringify({ title: document.title, url: location.href, text: out.join('\n'), elements });
})()
