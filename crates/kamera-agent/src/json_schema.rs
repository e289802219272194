//! A JSON Schema as a [`Grammar`] for constrained decoding: [`JsonGrammar::new`] compiles the
//! subset it can hold a reply to (objects with their properties, arrays, strings, numbers,
//! integers, booleans, enums of strings) and names any other keyword as unsupported, so an
//! extraction is either JSON valid against its schema by construction or a clear error before
//! the model runs.
//!
//! The reply is written in one canonical layout (`{"a": 1, "b": ["x", "y"]}`: every property in
//! the schema's order, `": "` and `", "` between), so the token mask checks a prefix against one
//! path, not against every spelling of the same JSON. Strings hold JSON's escapes (`\"`, `\\`,
//! `\n`, `\u00e9`, ...; no lone UTF-16 surrogate) and no raw control characters.

use serde_json::Value;

use crate::schema::{Fit, Grammar, MAX_FREE_CHARS};

/// Keywords the compiler reads (or that only describe: `title`, `description`, ...).
const KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "minLength",
    "maxLength",
    "title",
    "description",
    "$schema",
    "$id",
    "default",
    "examples",
];

/// Most items of an array whose schema sets no `maxItems`.
const MAX_ITEMS: usize = 16;
/// Most digits of a number.
const MAX_DIGITS: usize = 18;
/// Deepest nesting of objects and arrays.
const MAX_DEPTH: usize = 8;

/// One value of the schema, compiled.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    /// Properties in order: the key as written (quoted, JSON-escaped), its value.
    Object(Vec<(String, Node)>),
    Array {
        item: Box<Node>,
        min: usize,
        max: usize,
    },
    Str {
        min: usize,
        max: usize,
    },
    Number {
        integer: bool,
    },
    /// One of these JSON texts (`true`/`false`, or JSON strings).
    Literal(Vec<String>),
}

/// How far a reply gets through a node.
enum Walk {
    /// The node ends at this byte offset.
    Done(usize),
    /// The reply ran out inside the node; this closes the node the shortest way.
    Open(String),
    /// No value of the node starts like this.
    Dead,
}

/// A JSON Schema compiled for constrained decoding (see the module docs for the subset).
#[derive(Debug, Clone, PartialEq)]
pub struct JsonGrammar {
    root: Node,
}

impl JsonGrammar {
    /// Compiles `schema`; the error names the unsupported keyword or bad value and where it is
    /// (a JSON pointer), and what is supported.
    pub fn new(schema: &Value) -> std::result::Result<JsonGrammar, String> {
        let root = compile(schema, "", 0)?;
        match root {
            Node::Object(_) | Node::Array { .. } => Ok(JsonGrammar { root }),
            _ => Err(format!(
                "the schema's top level must be an object or an array (got {})",
                schema.get("type").map_or("no type".to_string(), |t| t.to_string())
            )),
        }
    }

    /// The shortest reply of the schema (every string empty or filled to its `minLength` with
    /// `-`, numbers 0, arrays at their `minItems`).
    pub fn shortest(&self) -> String {
        shortest(&self.root)
    }
}

impl Grammar for JsonGrammar {
    fn lead(&self) -> &str {
        match self.root {
            Node::Array { .. } => "[",
            _ => "{",
        }
    }

    fn fit(&self, reply: &str) -> Fit {
        match walk(&self.root, reply, 0) {
            Walk::Done(end) if end == reply.len() => Fit::Complete,
            Walk::Open(_) => Fit::Open,
            _ => Fit::Dead,
        }
    }

    fn close(&self, reply: &str) -> Option<String> {
        match walk(&self.root, reply, 0) {
            Walk::Done(end) if end == reply.len() => Some(reply.to_string()),
            Walk::Open(rest) => Some(format!("{reply}{rest}")),
            _ => None,
        }
    }
}

fn usize_of(o: &serde_json::Map<String, Value>, key: &str, path: &str) -> std::result::Result<Option<usize>, String> {
    match o.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| format!("{key} at {} must be a whole number >= 0 (got {v})", at(path))),
    }
}

fn at(path: &str) -> String {
    if path.is_empty() {
        "the top level".into()
    } else {
        format!("{path:?}")
    }
}

// Long: one arm per JSON Schema type, after the keyword checks.
fn compile(schema: &Value, path: &str, depth: usize) -> std::result::Result<Node, String> {
    if depth > MAX_DEPTH {
        return Err(format!("{} nests deeper than {MAX_DEPTH} levels", at(path)));
    }
    let Some(o) = schema.as_object() else {
        return Err(format!(
            "{} must be a schema object with a type (got {schema})",
            at(path)
        ));
    };
    if let Some(k) = o.keys().find(|k| !KEYWORDS.contains(&k.as_str())) {
        return Err(format!(
            "unsupported JSON Schema keyword {k:?} at {}; supported: {}",
            at(path),
            KEYWORDS.join(", ")
        ));
    }
    if let Some(e) = o.get("enum") {
        let values = e
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| format!("enum at {} must be a non-empty array", at(path)))?;
        let mut lits = Vec::new();
        for v in values {
            match v.as_str() {
                Some(s) if !s.is_empty() => lits.push(Value::String(s.into()).to_string()),
                _ => {
                    return Err(format!(
                        "enum at {}: only non-empty strings are supported (got {v})",
                        at(path)
                    ));
                }
            }
        }
        return Ok(Node::Literal(lits));
    }
    let ty = match o.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(t) => return Err(format!("type at {} must be one type name (got {t})", at(path))),
        None if o.contains_key("properties") => "object",
        None => return Err(format!("{} has no type (nor enum, nor properties)", at(path))),
    };
    match ty {
        "object" => {
            match o.get("additionalProperties") {
                None | Some(Value::Bool(false)) => {}
                Some(v) => {
                    return Err(format!(
                        "additionalProperties at {} is supported only as false (got {v})",
                        at(path)
                    ));
                }
            }
            let empty = serde_json::Map::new();
            let props = match o.get("properties") {
                None => &empty,
                Some(Value::Object(p)) => p,
                Some(v) => return Err(format!("properties at {} must be an object (got {v})", at(path))),
            };
            if let Some(req) = o.get("required") {
                let names = req
                    .as_array()
                    .ok_or_else(|| format!("required at {} must be an array of names", at(path)))?;
                if let Some(n) = names.iter().find(|n| n.as_str().is_none_or(|n| !props.contains_key(n))) {
                    return Err(format!(
                        "required at {} names {n}, which is not one of its properties",
                        at(path)
                    ));
                }
            }
            let mut fields = Vec::new();
            for (k, v) in props {
                let node = compile(v, &format!("{path}/properties/{k}"), depth + 1)?;
                fields.push((Value::String(k.clone()).to_string(), node));
            }
            Ok(Node::Object(fields))
        }
        "array" => {
            let items = o
                .get("items")
                .ok_or_else(|| format!("the array at {} needs items (the schema of its items)", at(path)))?;
            let item = compile(items, &format!("{path}/items"), depth + 1)?;
            let min = usize_of(o, "minItems", path)?.unwrap_or(0);
            let max = usize_of(o, "maxItems", path)?.unwrap_or(MAX_ITEMS.max(min));
            if min > max {
                return Err(format!("minItems {min} > maxItems {max} at {}", at(path)));
            }
            Ok(Node::Array {
                item: Box::new(item),
                min,
                max,
            })
        }
        "string" => {
            let min = usize_of(o, "minLength", path)?.unwrap_or(0);
            let max = usize_of(o, "maxLength", path)?
                .unwrap_or(MAX_FREE_CHARS)
                .min(MAX_FREE_CHARS);
            if min > max {
                return Err(format!(
                    "minLength {min} at {} is more than the {max} characters a string may hold",
                    at(path)
                ));
            }
            Ok(Node::Str { min, max })
        }
        "number" => Ok(Node::Number { integer: false }),
        "integer" => Ok(Node::Number { integer: true }),
        "boolean" => Ok(Node::Literal(vec!["true".into(), "false".into()])),
        other => Err(format!(
            "type {other:?} at {} is not supported (object, array, string, number, integer, boolean)",
            at(path)
        )),
    }
}

fn shortest(node: &Node) -> String {
    match node {
        Node::Object(fields) => {
            let inner: Vec<String> = fields.iter().map(|(k, v)| format!("{k}: {}", shortest(v))).collect();
            format!("{{{}}}", inner.join(", "))
        }
        Node::Array { item, min, .. } => format!("[{}]", vec![shortest(item); *min].join(", ")),
        Node::Str { min, .. } => format!("\"{}\"", "-".repeat(*min)),
        Node::Number { .. } => "0".into(),
        Node::Literal(lits) => lits.iter().min_by_key(|l| l.len()).cloned().unwrap_or_default(),
    }
}

fn lit(lit: &str, s: &str, pos: usize) -> Walk {
    let rest = &s[pos..];
    if rest.starts_with(lit) {
        Walk::Done(pos + lit.len())
    } else if let Some(left) = lit.strip_prefix(rest) {
        Walk::Open(left.to_string())
    } else {
        Walk::Dead
    }
}

/// How an escape after a backslash in a string reads.
enum Escape {
    Whole,
    /// The input ends inside it: the text that completes it.
    Cut(String),
    Bad,
}

/// Reads the escape after a backslash: one of `"\/bfnrt`, or `u` and four hex digits that are
/// not a UTF-16 surrogate (a lone one is not valid JSON text for a decoder; `\uD8..` is dead at
/// its second digit).
fn escape(chars: &mut std::str::CharIndices<'_>) -> Escape {
    match chars.next() {
        None => Escape::Cut("/".into()),
        Some((_, e)) if "\"\\/bfnrt".contains(e) => Escape::Whole,
        Some((_, 'u')) => {
            let mut hex = String::new();
            while hex.len() < 4 {
                match chars.next() {
                    None => return Escape::Cut("0".repeat(4 - hex.len())),
                    Some((_, h)) if h.is_ascii_hexdigit() => hex.push(h.to_ascii_uppercase()),
                    Some(_) => return Escape::Bad,
                }
                if hex.len() == 2 && hex.starts_with('D') && hex.as_bytes()[1] >= b'8' {
                    return Escape::Bad;
                }
            }
            Escape::Whole
        }
        Some(_) => Escape::Bad,
    }
}

// Long: one match arm per schema node kind.
fn walk(node: &Node, s: &str, pos: usize) -> Walk {
    match node {
        Node::Literal(lits) => {
            let mut open: Option<String> = None;
            for l in lits {
                match lit(l, s, pos) {
                    Walk::Done(e) => return Walk::Done(e),
                    Walk::Open(c) if open.as_ref().is_none_or(|o| c.len() < o.len()) => open = Some(c),
                    _ => {}
                }
            }
            open.map_or(Walk::Dead, Walk::Open)
        }
        Node::Str { min, max } => {
            let rest = &s[pos..];
            if rest.is_empty() {
                return Walk::Open(shortest(node));
            }
            if !rest.starts_with('"') {
                return Walk::Dead;
            }
            // Characters so far, an escape counting one; the completion of a cut escape.
            let mut n = 0;
            let dashes = |n: usize| "-".repeat(min.saturating_sub(n));
            let mut chars = rest[1..].char_indices();
            while let Some((i, c)) = chars.next() {
                if c == '"' {
                    return if n >= *min {
                        Walk::Done(pos + 1 + i + 1)
                    } else {
                        Walk::Dead
                    };
                }
                n += 1;
                if n > *max || c.is_control() {
                    return Walk::Dead;
                }
                if c == '\\' {
                    match escape(&mut chars) {
                        Escape::Whole => {}
                        Escape::Cut(tail) => return Walk::Open(format!("{tail}{}\"", dashes(n))),
                        Escape::Bad => return Walk::Dead,
                    }
                }
            }
            Walk::Open(format!("{}\"", dashes(n)))
        }
        Node::Number { integer } => number(s, pos, *integer),
        Node::Object(fields) => {
            let mut pos = match lit("{", s, pos) {
                Walk::Done(e) => e,
                other => return close_with(other, || shortest(node)[1..].to_string()),
            };
            for (i, (key, value)) in fields.iter().enumerate() {
                let rest_of = |from: usize| {
                    let tail: Vec<String> = fields[from..]
                        .iter()
                        .map(|(k, v)| format!(", {k}: {}", shortest(v)))
                        .collect();
                    format!("{}}}", tail.concat())
                };
                let head = if i == 0 {
                    format!("{key}: ")
                } else {
                    format!(", {key}: ")
                };
                pos = match lit(&head, s, pos) {
                    Walk::Done(e) => e,
                    Walk::Open(c) => return Walk::Open(format!("{c}{}{}", shortest(value), rest_of(i + 1))),
                    Walk::Dead => return Walk::Dead,
                };
                pos = match walk(value, s, pos) {
                    Walk::Done(e) => e,
                    Walk::Open(c) => return Walk::Open(format!("{c}{}", rest_of(i + 1))),
                    Walk::Dead => return Walk::Dead,
                };
            }
            lit("}", s, pos)
        }
        Node::Array { item, min, max } => {
            let mut pos = match lit("[", s, pos) {
                Walk::Done(e) => e,
                other => return close_with(other, || shortest(node)[1..].to_string()),
            };
            let fill = |count: usize| format!("{}]", format!(", {}", shortest(item)).repeat(min.saturating_sub(count)));
            let mut count = 0;
            loop {
                let rest = &s[pos..];
                if rest.is_empty() {
                    return Walk::Open(match count {
                        0 if *min > 0 => format!("{}{}", shortest(item), fill(1)),
                        _ => fill(count),
                    });
                }
                if rest.starts_with(']') {
                    return if count >= *min { Walk::Done(pos + 1) } else { Walk::Dead };
                }
                if count > 0 {
                    pos = match lit(", ", s, pos) {
                        Walk::Done(e) if count < *max => e,
                        Walk::Open(c) if count < *max => {
                            return Walk::Open(format!("{c}{}{}", shortest(item), fill(count + 1)));
                        }
                        _ => return Walk::Dead,
                    };
                }
                pos = match walk(item, s, pos) {
                    Walk::Done(e) => e,
                    Walk::Open(c) => return Walk::Open(format!("{c}{}", fill(count + 1))),
                    Walk::Dead => return Walk::Dead,
                };
                count += 1;
            }
        }
    }
}

/// An opening bracket met or not: a reply that ran out before it is closed by the whole node.
fn close_with(w: Walk, rest: impl FnOnce() -> String) -> Walk {
    match w {
        Walk::Open(c) => Walk::Open(format!("{c}{}", rest())),
        other => other,
    }
}

/// A JSON number (no exponent; `integer`: no fraction either), ended by the first character
/// that cannot continue it.
fn number(s: &str, pos: usize, integer: bool) -> Walk {
    let b = s.as_bytes();
    let mut i = pos;
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let digits = i - int_start;
    if digits > 1 && b[int_start] == b'0' {
        return Walk::Dead;
    }
    if i == b.len() {
        return Walk::Open(if digits == 0 { "0".into() } else { String::new() });
    }
    if digits == 0 {
        return Walk::Dead;
    }
    let mut total = digits;
    if b[i] == b'.' && !integer {
        i += 1;
        let frac = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        total += i - frac;
        if i == b.len() {
            return Walk::Open(if i == frac { "0".into() } else { String::new() });
        }
        if i == frac {
            return Walk::Dead;
        }
    }
    if total > MAX_DIGITS { Walk::Dead } else { Walk::Done(i) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn order() -> JsonGrammar {
        JsonGrammar::new(&json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "minLength": 1},
                "status": {"enum": ["Delivered", "In transit"]},
                "items": {"type": "integer"},
                "paid": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}
            },
            "required": ["id"]
        }))
        .expect("compiles")
    }

    /// Every prefix of a valid reply is open, the reply is complete and parses to the value.
    #[test]
    fn a_valid_reply_is_open_then_complete() {
        let g = order();
        let reply = r#"{"id": "A-1042", "items": 3, "paid": false, "status": "In transit", "tags": ["x", "y z"]}"#;
        for i in 1..reply.len() {
            assert_eq!(g.fit(&reply[..i]), Fit::Open, "{}", &reply[..i]);
        }
        assert_eq!(g.fit(reply), Fit::Complete);
        let v: Value = serde_json::from_str(reply).expect("JSON");
        assert_eq!(v["status"], "In transit");
    }

    /// Wrong enum values, quotes in strings, a fraction in an integer, a third tag, an empty
    /// required-length string and another layout are dead.
    #[test]
    fn invalid_replies_are_dead() {
        let g = order();
        for bad in [
            r#"{"id": "", "#,
            r#"{"id": "a\x"#,
            r#"{"id": "a\u12g"#,
            r#"{"id": "a\ud834"#,
            "{\"id\": \"a\nb",
            r#"{"id": "a", "items": 1.5"#,
            r#"{"id": "a", "items": 01"#,
            r#"{"id": "a", "items": 1, "paid": maybe"#,
            r#"{"id": "a", "items": 1, "paid": true, "status": "Lost"#,
            r#"{"id": "a", "items": 1, "paid": true, "status": "Delivered", "tags": ["a", "b", "#,
            r#"{"id":"a""#,
            r#"{"x"#,
        ] {
            assert_eq!(g.fit(bad), Fit::Dead, "{bad}");
        }
    }

    /// Escapes in a string: every prefix open (a cut escape too), the reply complete and decoded
    /// by a JSON parser to the text; a cut escape closes into valid JSON.
    #[test]
    fn strings_hold_json_escapes() {
        let g = order();
        let reply =
            r#"{"id": "say \"hi\" \\ \/ \n caf\u00e9", "items": 1, "paid": true, "status": "Delivered", "tags": []}"#;
        for i in 1..reply.len() {
            assert_eq!(g.fit(&reply[..i]), Fit::Open, "{}", &reply[..i]);
            let closed = g.close(&reply[..i]).unwrap_or_else(|| panic!("{}", &reply[..i]));
            serde_json::from_str::<Value>(&closed).unwrap_or_else(|e| panic!("{closed}: {e}"));
        }
        assert_eq!(g.fit(reply), Fit::Complete);
        let v: Value = serde_json::from_str(reply).expect("JSON");
        assert_eq!(v["id"], "say \"hi\" \\ / \n café");
    }

    /// A reply cut anywhere closes into a complete one that parses.
    #[test]
    fn every_cut_closes_into_valid_json() {
        let g = order();
        let reply = r#"{"id": "A-1042", "items": 3, "paid": false, "status": "In transit", "tags": ["x"]}"#;
        for i in 1..reply.len() {
            let closed = g.close(&reply[..i]).unwrap_or_else(|| panic!("{}", &reply[..i]));
            assert_eq!(g.fit(&closed), Fit::Complete, "{closed}");
            let v: Value = serde_json::from_str(&closed).unwrap_or_else(|e| panic!("{closed}: {e}"));
            assert!(v["id"].as_str().is_some_and(|s| !s.is_empty()), "{closed}");
        }
        assert_eq!(g.fit(&g.shortest()), Fit::Complete);
    }

    /// Unsupported keywords and types are errors naming them and where they are.
    #[test]
    fn unsupported_schemas_are_named() {
        let e = JsonGrammar::new(&json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}))
            .expect_err("pattern");
        assert!(e.contains("\"pattern\"") && e.contains("/properties/a"), "{e}");
        let e = JsonGrammar::new(&json!({"anyOf": []})).expect_err("anyOf");
        assert!(e.contains("\"anyOf\""), "{e}");
        let e = JsonGrammar::new(&json!({"type": "string"})).expect_err("top level");
        assert!(e.contains("top level"), "{e}");
        let e = JsonGrammar::new(&json!({"type": "object", "properties": {"n": {"type": "null"}}})).expect_err("null");
        assert!(e.contains("\"null\""), "{e}");
        let e =
            JsonGrammar::new(&json!({"type": "object", "properties": {}, "required": ["a"]})).expect_err("required");
        assert!(e.contains("\"a\""), "{e}");
    }
}
