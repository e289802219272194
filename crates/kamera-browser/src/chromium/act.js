// What an action needs of its element, found by the data-kid the last observation set (in the
// document, an open shadow root or a same-origin frame). Called as (op, kid, arg); returns
// {x, y, href, checked, ...} (x, y in the top viewport) or {err: 'gone' | 'hidden' | ..., detail}.
(op, kid, arg) => {
  const find = (root) => {
    const hit = root.querySelector(`[data-kid="${kid}"]`);
    if (hit) return hit;
    for (const e of root.querySelectorAll('*')) {
      let inner = null;
      if (e.shadowRoot) inner = find(e.shadowRoot);
      if (!inner && (e.tagName === 'IFRAME' || e.tagName === 'FRAME')) {
        let d = null;
        try { d = e.contentDocument; } catch (_) {}
        if (d) inner = find(d);
      }
      if (inner) return inner;
    }
    return null;
  };
  const el = find(document);
  if (!el) return { err: 'gone' };
  const tag = el.tagName.toLowerCase();
  const getComputedStyle = (e) => e.ownerDocument.defaultView.getComputedStyle(e);
  const visible = (e) => {
    if (!e || !e.isConnected) return false;
    const st = getComputedStyle(e);
    if (st.display === 'none' || st.visibility === 'hidden' || Number(st.opacity) === 0) return false;
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  const centre = (e) => {
    e.scrollIntoView({ block: 'center', inline: 'center' });
    const r = e.getBoundingClientRect();
    let x = r.left + r.width / 2, y = r.top + r.height / 2;
    // Up the chain of same-origin frames to the top viewport.
    for (let w = e.ownerDocument.defaultView; w !== window && w.frameElement; w = w.frameElement.ownerDocument.defaultView) {
      const f = w.frameElement.getBoundingClientRect();
      x += f.left + w.frameElement.clientLeft;
      y += f.top + w.frameElement.clientTop;
    }
    return { x, y };
  };
  const hidden = { err: 'hidden', detail: `element [${kid}] (${tag}) is not visible` };
  const disabled = (e) => e.disabled || e.getAttribute('aria-disabled') === 'true';
  const CHECKABLE = 'input[type=checkbox],input[type=radio],[role=checkbox],[role=radio],[role=switch],[role=menuitemcheckbox]';
  const checkable = () => {
    if (el.matches(CHECKABLE)) return el;
    if (tag === 'label' && el.control) return el.control;
    const inner = el.querySelector(CHECKABLE);
    if (inner) return inner;
    const lab = el.closest('label');
    return lab && lab.control && lab.control.matches(CHECKABLE) ? lab.control : null;
  };
  const stateOf = (c) => (c.tagName === 'INPUT' ? c.checked : c.getAttribute('aria-checked') === 'true');
  switch (op) {
    case 'point': {
      if (!visible(el)) return hidden;
      const a = el.closest('a[href]');
      return { ...centre(el), href: a ? a.href : null };
    }
    case 'focus': {
      if (!visible(el)) return hidden;
      const f = el.matches('input,textarea,[contenteditable]') ? el : (el.control || el.querySelector('input,textarea,[contenteditable]') || el);
      if (disabled(f)) return { err: 'disabled', detail: `element [${kid}] (${tag}) is disabled` };
      f.focus();
      // A page may move the focus away (an onfocus handler) to catch what is typed: refuse.
      const root = f.getRootNode();
      if (root.activeElement !== f) {
        const to = root.activeElement;
        return { err: 'focus', detail: `element [${kid}] (${tag}) did not keep the focus: the page moved it to ${to ? to.tagName.toLowerCase() + (to.id ? '#' + to.id : '') : 'nothing'}` };
      }
      if ('value' in f && f.tagName !== 'SELECT' && f.tagName !== 'BUTTON') f.value = '';
      // Typed in this same turn of the page's event loop, so no page script runs between the
      // check above and the text landing in the element.
      if (arg !== null && !f.ownerDocument.execCommand('insertText', false, String(arg))) return { ok: true, inserted: false };
      return { ok: true, inserted: arg !== null };
    }
    case 'select': {
      const s = tag === 'select' ? el : (el.control && el.control.tagName === 'SELECT' ? el.control : el.querySelector('select'));
      if (!s) return { err: 'kind', detail: `element [${kid}] is a ${tag}, not a select (nor holds one)` };
      if (!visible(s)) return hidden;
      if (disabled(s)) return { err: 'disabled', detail: `select [${kid}] is disabled` };
      const want = String(arg).trim();
      const opts = Array.from(s.options);
      let i = opts.findIndex((o) => o.text.trim() === want || o.value === want);
      if (i < 0) i = opts.findIndex((o) => o.text.trim().toLowerCase() === want.toLowerCase());
      if (i < 0) {
        const names = opts.map((o) => JSON.stringify(o.text.trim())).join(', ');
        return { err: 'option', detail: `select [${kid}] has no option ${JSON.stringify(want)} (options: ${names})` };
      }
      s.focus();
      s.selectedIndex = i;
      s.dispatchEvent(new Event('input', { bubbles: true }));
      s.dispatchEvent(new Event('change', { bubbles: true }));
      return { ok: true, value: opts[i].text.trim() };
    }
    case 'checkable': {
      const c = checkable();
      if (!c) return { err: 'kind', detail: `element [${kid}] is a ${tag}, not a checkbox, radio or switch (nor labels one)` };
      if (disabled(c)) return { err: 'disabled', detail: `element [${kid}] is disabled` };
      if (arg === false && c.matches('input[type=radio],[role=radio]')) {
        return { err: 'kind', detail: `element [${kid}] is a radio button: check another option instead of unchecking it` };
      }
      const at = visible(c) ? c : visible(el) ? el : (c.labels && Array.from(c.labels).find(visible));
      if (!at) return hidden;
      return { ...centre(at), checked: stateOf(c) };
    }
    default:
      return { err: 'op', detail: `unknown action ${op}` };
  }
}
