//! `response_format` by constrained sampling: a JSON document (any object, or one that
//! matches a JSON Schema of the supported subset) is checked byte by byte as it is generated,
//! and a token whose text cannot continue a valid document is never picked.
//!
//! - [`Schema`]: a compiled schema (object with properties/required, string, number,
//!   integer, boolean, null, enum, array with items; `{}` is any value). Anything outside
//!   the subset, or not valid JSON Schema, is refused with the keyword and where it is.
//! - [`JsonState`]: the incremental validator, a stack of frames (one per open value). It
//!   also knows the fewest bytes that finish the document from where it is
//!   ([`JsonState::min_close`]); a token is allowed only if the document can still be closed
//!   within the tokens left, so that generation always ends with a whole document (every
//!   byte used to close one is a token of its own in byte-level vocabularies).
//! - [`TokenBytes`]: each token's text, computed once per tokenizer.
//! - [`pick`]: the next token: the sampler's choice when valid; after a few refused
//!   candidates, the sampler over the logits with every invalid token masked.
//!
//! Bounded output: whitespace runs between tokens are capped, integers have at most 15
//! digits (they fit i64), exponents at most 2 (the f64 range), `\u` escapes avoid
//! surrogates (serde_json refuses lone ones), nesting at most `MAX_DEPTH`.

use std::sync::Arc;

use serde_json::Value;
use sinter_core::Rng;
use sinter_models::decoder::SamplingParams;

use crate::text::Tokenizer;

const MAX_WS: u8 = 8;
const MAX_INT_DIGITS: u8 = 15;
const MAX_EXP_DIGITS: u8 = 2;
const MAX_DEPTH: usize = 32;

/// One node of a compiled schema.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    /// Any JSON value.
    Any,
    /// An object with any keys, any values (`json_object`).
    AnyObject,
    /// Declared properties (name, node) and which are required. Only these are written.
    Object {
        props: Vec<(Vec<u8>, usize)>,
        required: Vec<bool>,
    },
    Array(usize),
    String,
    Number,
    Integer,
    Boolean,
    Null,
    /// The compact JSON text of each allowed value.
    Enum(Vec<Vec<u8>>),
}

/// A compiled schema: nodes, the root first (always an object).
#[derive(Debug)]
pub struct Schema {
    nodes: Vec<Node>,
    /// Each node's shortest text.
    min_len: Vec<usize>,
    /// The node of any value (a free object's values), added to every schema.
    any: usize,
}

/// Keywords that describe and do not constrain.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
];

/// A schema error: the keyword, where (a JSON pointer) and why.
fn refuse(at: &str, what: String) -> String {
    let at = if at.is_empty() { "/" } else { at };
    format!("{what} (at {at})")
}

impl Schema {
    /// `{"type":"json_object"}`: any object.
    pub fn any_object() -> Schema {
        Schema::finish(vec![Node::AnyObject])
    }

    /// Compiles a JSON Schema of the supported subset; its top level must be an object.
    pub fn compile(v: &Value) -> Result<Schema, String> {
        let mut nodes = Vec::new();
        compile_node(v, "", &mut nodes)?;
        if !matches!(nodes[0], Node::Object { .. }) {
            return Err(refuse(
                "",
                "keyword 'type': the top level of the schema must be {\"type\": \"object\", ...}"
                    .into(),
            ));
        }
        Ok(Schema::finish(nodes))
    }

    fn finish(mut nodes: Vec<Node>) -> Schema {
        nodes.push(Node::Any);
        let mut s = Schema {
            min_len: vec![usize::MAX; nodes.len()],
            any: nodes.len() - 1,
            nodes,
        };
        // Children have larger indices than their parents: fill from the end.
        for i in (0..s.nodes.len()).rev() {
            s.min_len[i] = s.node_min_len(i);
        }
        s
    }

    fn node_min_len(&self, i: usize) -> usize {
        match &self.nodes[i] {
            Node::Any | Node::Number | Node::Integer => 1,
            Node::AnyObject | Node::Array(_) | Node::String => 2,
            Node::Boolean | Node::Null => 4,
            Node::Enum(opts) => opts.iter().map(Vec::len).min().unwrap_or(usize::MAX),
            Node::Object { props, required } => {
                let need: Vec<usize> = props
                    .iter()
                    .zip(required)
                    .filter(|(_, &r)| r)
                    .map(|((name, n), _)| prop_len(name, self.min_len[*n]))
                    .collect();
                2 + need.iter().sum::<usize>() + need.len().saturating_sub(1)
            }
        }
    }

    /// The fewest bytes of a whole document.
    pub fn min_doc_len(&self) -> usize {
        self.min_len[0]
    }
}

/// `"name":value` at its shortest.
fn prop_len(name: &[u8], value: usize) -> usize {
    name.len() + 3 + value
}

fn compile_node(v: &Value, at: &str, nodes: &mut Vec<Node>) -> Result<usize, String> {
    let me = nodes.len();
    nodes.push(Node::Any);
    let obj = match v {
        Value::Bool(true) => return Ok(me),
        Value::Object(o) => o,
        _ => {
            return Err(refuse(
                at,
                format!("a schema must be a JSON object, got {v}"),
            ))
        }
    };
    let allowed: &[&str] = match obj.get("type").and_then(Value::as_str) {
        Some("object") => &["type", "properties", "required", "additionalProperties"],
        Some("array") => &["type", "items"],
        _ => &["type", "enum"],
    };
    for k in obj.keys() {
        if !allowed.contains(&k.as_str()) && !ANNOTATIONS.contains(&k.as_str()) {
            return Err(refuse(at, format!("keyword '{k}' is not supported here (supported: type object with properties, required, additionalProperties; array with items; string, number, integer, boolean, null; enum)")));
        }
    }
    if let Some(e) = obj.get("enum") {
        let opts = e
            .as_array()
            .filter(|a| !a.is_empty())
            .ok_or_else(|| refuse(at, "keyword 'enum' must be a non-empty array".into()))?;
        let texts = opts.iter().map(|o| o.to_string().into_bytes()).collect();
        // A type beside enum: every value must have it.
        if let Some(t) = obj.get("type") {
            let ty = type_node(t, at)?;
            if let Some(bad) = opts.iter().find(|o| !matches_type(&ty, o)) {
                return Err(refuse(
                    at,
                    format!("keyword 'enum': {bad} is not of the schema's 'type' {t}"),
                ));
            }
        }
        nodes[me] = Node::Enum(texts);
        return Ok(me);
    }
    let Some(t) = obj.get("type") else {
        if obj.keys().all(|k| ANNOTATIONS.contains(&k.as_str())) {
            return Ok(me);
        }
        return Err(refuse(at, "keyword 'type' is missing".into()));
    };
    nodes[me] = match type_node(t, at)? {
        Node::Object { .. } => compile_object(obj, at, nodes)?,
        Node::Array(_) => {
            let items = obj.get("items").unwrap_or(&Value::Bool(true));
            Node::Array(compile_node(items, &format!("{at}/items"), nodes)?)
        }
        other => other,
    };
    Ok(me)
}

/// The node of a `type` value (objects and arrays without their parts yet).
fn type_node(t: &Value, at: &str) -> Result<Node, String> {
    Ok(match t.as_str() {
        Some("object") => Node::Object {
            props: Vec::new(),
            required: Vec::new(),
        },
        Some("array") => Node::Array(0),
        Some("string") => Node::String,
        Some("number") => Node::Number,
        Some("integer") => Node::Integer,
        Some("boolean") => Node::Boolean,
        Some("null") => Node::Null,
        _ if t.is_array() => {
            return Err(refuse(
                at,
                format!("keyword 'type': a list of types ({t}) is not supported; use one type"),
            ))
        }
        _ => {
            return Err(refuse(
                at,
                format!("keyword 'type' must be one of object, array, string, number, integer, boolean, null; got {t}"),
            ))
        }
    })
}

fn matches_type(ty: &Node, v: &Value) -> bool {
    match ty {
        Node::String => v.is_string(),
        Node::Number => v.is_number(),
        Node::Integer => v.is_i64() || v.is_u64(),
        Node::Boolean => v.is_boolean(),
        Node::Null => v.is_null(),
        Node::Object { .. } => v.is_object(),
        Node::Array(_) => v.is_array(),
        _ => true,
    }
}

fn compile_object(
    obj: &serde_json::Map<String, Value>,
    at: &str,
    nodes: &mut Vec<Node>,
) -> Result<Node, String> {
    let empty = serde_json::Map::new();
    let props = match obj.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => {
            return Err(refuse(
                at,
                "keyword 'properties' must be an object of schemas".into(),
            ))
        }
    };
    match obj.get("additionalProperties") {
        None | Some(Value::Bool(_)) => {}
        Some(_) => return Err(refuse(at, "keyword 'additionalProperties': only true or false is supported (this server writes the declared properties only)".into())),
    }
    let mut out = Vec::new();
    for (name, s) in props {
        if name.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
            return Err(refuse(at, format!("keyword 'properties': the name {name:?} needs escaping in JSON, which is not supported")));
        }
        let n = compile_node(s, &format!("{at}/properties/{name}"), nodes)?;
        out.push((name.clone().into_bytes(), n));
    }
    let mut required = vec![false; out.len()];
    if let Some(r) = obj.get("required") {
        let list = r.as_array().ok_or_else(|| {
            refuse(
                at,
                "keyword 'required' must be an array of property names".into(),
            )
        })?;
        for name in list {
            let i = name
                .as_str()
                .and_then(|n| out.iter().position(|(p, _)| p == n.as_bytes()))
                .ok_or_else(|| {
                    refuse(
                        at,
                        format!(
                            "keyword 'required': {name} is not one of the declared 'properties'"
                        ),
                    )
                })?;
            required[i] = true;
        }
    }
    Ok(Node::Object {
        props: out,
        required,
    })
}

/// Where in a string (value or key) the lexer is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct StrLex {
    /// 0: plain; 1: after a backslash; 2..=5: in `\u`, (esc - 2) hex digits read.
    esc: u8,
    /// Continuation bytes the current UTF-8 character still needs, and the range of the next.
    need: u8,
    lo: u8,
    hi: u8,
}

enum Lexed {
    Byte,
    End,
    Bad,
}

impl StrLex {
    fn step(&mut self, b: u8) -> Lexed {
        if self.need > 0 {
            if !(self.lo..=self.hi).contains(&b) {
                return Lexed::Bad;
            }
            self.need -= 1;
            (self.lo, self.hi) = (0x80, 0xBF);
            return Lexed::Byte;
        }
        match self.esc {
            1 => {
                self.esc = match b {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => 0,
                    b'u' => 2,
                    _ => return Lexed::Bad,
                };
                return Lexed::Byte;
            }
            // No surrogates (D800..DFFF): serde_json refuses unpaired ones.
            2 if b == b'd' || b == b'D' => return Lexed::Bad,
            2..=5 => {
                if !b.is_ascii_hexdigit() {
                    return Lexed::Bad;
                }
                self.esc = if self.esc == 5 { 0 } else { self.esc + 1 };
                return Lexed::Byte;
            }
            _ => {}
        }
        let (need, lo, hi) = match b {
            b'"' => return Lexed::End,
            b'\\' => {
                self.esc = 1;
                return Lexed::Byte;
            }
            0..=0x1F => return Lexed::Bad,
            0x20..=0x7F => return Lexed::Byte,
            0xC2..=0xDF => (1, 0x80, 0xBF),
            0xE0 => (2, 0xA0, 0xBF),
            0xED => (2, 0x80, 0x9F),
            0xE1..=0xEF => (2, 0x80, 0xBF),
            0xF0 => (3, 0x90, 0xBF),
            0xF1..=0xF3 => (3, 0x80, 0xBF),
            0xF4 => (3, 0x80, 0x8F),
            _ => return Lexed::Bad,
        };
        (self.need, self.lo, self.hi) = (need, lo, hi);
        Lexed::Byte
    }
    /// Bytes that finish the string, its closing quote included.
    fn min_close(&self) -> usize {
        let esc = match self.esc {
            0 => 0,
            1 => 1,
            k => 6 - k as usize,
        };
        1 + esc + self.need as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum NumAt {
    Start,
    Sign,
    Zero,
    Int,
    Dot,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

/// Where an object or array is between its parts.
#[derive(Clone, Debug, PartialEq)]
enum Stage {
    Open,
    /// In a key: its bytes so far (declared properties), or the lexer (any object).
    Key(Vec<u8>, StrLex),
    /// After a key (the property's index for declared ones), before ':'.
    Colon(usize),
    /// After a value (or while it is being written, above this frame).
    Value,
    Comma,
}

#[derive(Clone, Debug)]
enum Frame {
    /// A value of this node, not begun (whitespace may come first).
    Value(usize),
    Str(StrLex),
    Num {
        at: NumAt,
        int: bool,
        digits: u8,
    },
    Lit {
        text: &'static [u8],
        pos: usize,
    },
    Enum {
        node: usize,
        typed: Vec<u8>,
    },
    Arr {
        item: usize,
        stage: Stage,
    },
    /// An object of declared properties (`Some(node)`), or any object.
    Obj {
        node: Option<usize>,
        used: Vec<bool>,
        stage: Stage,
    },
}

/// What a frame did with a byte.
enum Step {
    /// Taken; the frame goes on.
    Took,
    /// Taken, and the frame's value is whole.
    Closed,
    /// Not taken, and the value was already whole: its parent gets the byte.
    Ended,
    /// Replaced by this frame, which gets the byte.
    Become(Frame),
    /// Taken, and the frame replaced by this one.
    Replace(Frame),
    /// Not taken: this frame is pushed above and gets the byte (an array's item begins).
    Push(Frame),
    /// Taken, and this frame pushed above (an object's value follows its ':').
    TookPush(Frame),
    Bad,
}

/// The validator's state after the bytes so far (cheap to clone: a short stack).
#[derive(Clone, Debug)]
pub struct JsonState {
    schema: Arc<Schema>,
    stack: Vec<Frame>,
    /// Whitespace bytes in a row.
    ws: u8,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\t')
}

impl JsonState {
    pub fn new(schema: Arc<Schema>) -> JsonState {
        JsonState {
            schema,
            stack: vec![Frame::Value(0)],
            ws: 0,
        }
    }

    /// Whether the document is whole.
    pub fn is_complete(&self) -> bool {
        self.stack.is_empty()
    }

    /// Feeds `bytes`; false when they cannot continue a valid document (the state is then
    /// meaningless: check on a clone).
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed_byte(b))
    }

    fn feed_byte(&mut self, b: u8) -> bool {
        loop {
            let Some(top) = self.stack.last_mut() else {
                return false;
            };
            let step = step_frame(top, &self.schema, b);
            match step {
                Step::Took => {}
                Step::Closed => {
                    self.stack.pop();
                }
                Step::Ended => {
                    self.stack.pop();
                    continue;
                }
                Step::Become(f) => {
                    *top = f;
                    continue;
                }
                Step::Replace(f) => *top = f,
                Step::TookPush(f) => {
                    if self.stack.len() >= MAX_DEPTH {
                        return false;
                    }
                    self.stack.push(f);
                }
                Step::Push(f) => {
                    if self.stack.len() >= MAX_DEPTH {
                        return false;
                    }
                    self.stack.push(f);
                    continue;
                }
                Step::Bad => return false,
            }
            return self.count_ws(b);
        }
    }

    /// Whitespace in a row is capped (a byte reaches here only where the grammar took it,
    /// and inside strings whitespace is text, not counted).
    fn count_ws(&mut self, b: u8) -> bool {
        let in_text = matches!(
            self.stack.last(),
            Some(Frame::Str(_))
                | Some(Frame::Obj {
                    stage: Stage::Key(..),
                    ..
                })
        );
        if is_ws(b) && !in_text {
            self.ws += 1;
            return self.ws <= MAX_WS;
        }
        self.ws = 0;
        true
    }

    /// The fewest bytes that make the document whole from here.
    pub fn min_close(&self) -> usize {
        let s = &self.schema;
        self.stack.iter().map(|f| frame_min_close(f, s)).sum()
    }
}

fn step_frame(f: &mut Frame, s: &Schema, b: u8) -> Step {
    match f {
        Frame::Value(node) => begin_value(s, *node, b),
        Frame::Str(lex) => match lex.step(b) {
            Lexed::Byte => Step::Took,
            Lexed::End => Step::Closed,
            Lexed::Bad => Step::Bad,
        },
        Frame::Num { at, int, digits } => step_number(at, *int, digits, b),
        Frame::Lit { text, pos } => {
            if text.get(*pos) != Some(&b) {
                return Step::Bad;
            }
            *pos += 1;
            if *pos == text.len() {
                Step::Closed
            } else {
                Step::Took
            }
        }
        Frame::Enum { node, typed } => step_enum(enum_options(s, *node), typed, b),
        Frame::Arr { item, stage } => step_array(*item, stage, b),
        Frame::Obj { node, used, stage } => match node.map(|n| &s.nodes[n]) {
            Some(Node::Object { props, required }) => step_object(props, required, used, stage, b),
            _ => step_any_object(stage, b, s.any),
        },
    }
}

fn enum_options(s: &Schema, node: usize) -> &[Vec<u8>] {
    match &s.nodes[node] {
        Node::Enum(opts) => opts,
        _ => &[],
    }
}

/// The first byte of a value of `node` (whitespace before it stays in this frame).
fn begin_value(s: &Schema, node: usize, b: u8) -> Step {
    if is_ws(b) {
        return Step::Took;
    }
    let lit = |text: &'static [u8]| Step::Become(Frame::Lit { text, pos: 0 });
    let num = |int| {
        Step::Become(Frame::Num {
            at: NumAt::Start,
            int,
            digits: 0,
        })
    };
    let object = |node: Option<usize>, n: usize| {
        Step::Replace(Frame::Obj {
            node,
            used: vec![false; n],
            stage: Stage::Open,
        })
    };
    let array = |item: usize| {
        Step::Replace(Frame::Arr {
            item,
            stage: Stage::Open,
        })
    };
    match (&s.nodes[node], b) {
        (Node::Enum(_), _) => Step::Become(Frame::Enum {
            node,
            typed: Vec::new(),
        }),
        (Node::Any | Node::String, b'"') => Step::Replace(Frame::Str(StrLex::default())),
        (Node::Any | Node::Number, b'-' | b'0'..=b'9') => num(false),
        (Node::Integer, b'-' | b'0'..=b'9') => num(true),
        (Node::Any | Node::Boolean, b't') => lit(b"true"),
        (Node::Any | Node::Boolean, b'f') => lit(b"false"),
        (Node::Any | Node::Null, b'n') => lit(b"null"),
        (Node::Any, b'[') => array(node),
        (Node::Array(item), b'[') => array(*item),
        (Node::Any | Node::AnyObject, b'{') => object(None, 0),
        (Node::Object { props, .. }, b'{') => object(Some(node), props.len()),
        _ => Step::Bad,
    }
}

/// JSON's number grammar, state by state; a byte that cannot continue a whole number ends
/// it. `digits` counts the integer part's digits, then (reset at 'e') the exponent's.
fn step_number(at: &mut NumAt, int: bool, digits: &mut u8, b: u8) -> Step {
    use NumAt::*;
    let d = b.is_ascii_digit();
    let next = match (*at, b) {
        (Start, b'-') => Sign,
        // No "-0" integers: serde_json may read them as the float -0.0.
        (Sign, b'0') if int => return Step::Bad,
        (Start | Sign, b'0') => Zero,
        (Start | Sign | Int, _) if d => Int,
        (Zero | Int, b'.') if !int => Dot,
        (Zero | Int | Frac, b'e' | b'E') if !int => Exp,
        (Dot | Frac, _) if d => Frac,
        (Exp, b'+' | b'-') => ExpSign,
        (Exp | ExpSign | ExpDigits, _) if d => ExpDigits,
        (Zero | Int | Frac | ExpDigits, _) => return Step::Ended,
        _ => return Step::Bad,
    };
    if next == Exp {
        *digits = 0;
    }
    if matches!(next, Zero | Int | ExpDigits) {
        *digits += 1;
        let cap = if next == ExpDigits {
            MAX_EXP_DIGITS
        } else {
            MAX_INT_DIGITS
        };
        if *digits > cap {
            return Step::Bad;
        }
    }
    *at = next;
    Step::Took
}

/// One of the enum's texts, byte by byte; whole when no longer one can follow.
fn step_enum(opts: &[Vec<u8>], typed: &mut Vec<u8>, b: u8) -> Step {
    let was_whole = opts.iter().any(|o| o == typed);
    typed.push(b);
    let longer = opts
        .iter()
        .any(|o| o.len() > typed.len() && o.starts_with(typed));
    let whole = opts.iter().any(|o| o == typed);
    match (longer, whole) {
        (true, _) => Step::Took,
        (false, true) => Step::Closed,
        (false, false) => {
            typed.pop();
            if was_whole {
                Step::Ended
            } else {
                Step::Bad
            }
        }
    }
}

fn step_array(item: usize, stage: &mut Stage, b: u8) -> Step {
    if is_ws(b) {
        return Step::Took;
    }
    match (&*stage, b) {
        (Stage::Open | Stage::Value, b']') => Step::Closed,
        (Stage::Value, b',') => {
            *stage = Stage::Comma;
            Step::Took
        }
        (Stage::Open | Stage::Comma, _) => {
            *stage = Stage::Value;
            Step::Push(Frame::Value(item))
        }
        _ => Step::Bad,
    }
}

/// An object of declared properties: only they are written, each once, and it closes only
/// once every required one is there.
fn step_object(
    props: &[(Vec<u8>, usize)],
    required: &[bool],
    used: &mut [bool],
    stage: &mut Stage,
    b: u8,
) -> Step {
    let missing = required.iter().zip(used.iter()).any(|(&r, &u)| r && !u);
    let unused = used.iter().any(|&u| !u);
    if let Stage::Key(typed, _) = stage {
        if b == b'"' {
            let Some(i) = (0..props.len()).find(|&i| !used[i] && props[i].0 == *typed) else {
                return Step::Bad;
            };
            used[i] = true;
            *stage = Stage::Colon(i);
            return Step::Took;
        }
        typed.push(b);
        let fits = (0..props.len()).any(|i| !used[i] && props[i].0.starts_with(typed));
        return if fits { Step::Took } else { Step::Bad };
    }
    if is_ws(b) {
        return Step::Took;
    }
    match (&*stage, b) {
        (Stage::Open | Stage::Comma, b'"') if unused => {
            *stage = Stage::Key(Vec::new(), StrLex::default());
            Step::Took
        }
        (Stage::Open | Stage::Value, b'}') if !missing => Step::Closed,
        (Stage::Value, b',') if unused => {
            *stage = Stage::Comma;
            Step::Took
        }
        (Stage::Colon(i), b':') => {
            let node = props[*i].1;
            *stage = Stage::Value;
            Step::TookPush(Frame::Value(node))
        }
        _ => Step::Bad,
    }
}

/// An object with any keys (strings) and any values.
fn step_any_object(stage: &mut Stage, b: u8, any: usize) -> Step {
    if let Stage::Key(_, lex) = stage {
        return match lex.step(b) {
            Lexed::Byte => Step::Took,
            Lexed::End => {
                *stage = Stage::Colon(0);
                Step::Took
            }
            Lexed::Bad => Step::Bad,
        };
    }
    if is_ws(b) {
        return Step::Took;
    }
    match (&*stage, b) {
        (Stage::Open | Stage::Comma, b'"') => {
            *stage = Stage::Key(Vec::new(), StrLex::default());
            Step::Took
        }
        (Stage::Open | Stage::Value, b'}') => Step::Closed,
        (Stage::Value, b',') => {
            *stage = Stage::Comma;
            Step::Took
        }
        (Stage::Colon(_), b':') => {
            *stage = Stage::Value;
            // Node 0 of any schema is not `Any`; the free object's values are: see ANY.
            Step::TookPush(Frame::Value(any))
        }
        _ => Step::Bad,
    }
}

/// The fewest bytes that finish frame `f` (for an object, its missing required properties
/// and its closing brace; for an array, its closing bracket).
fn frame_min_close(f: &Frame, s: &Schema) -> usize {
    match f {
        Frame::Value(node) => s.min_len[*node],
        Frame::Str(lex) => lex.min_close(),
        Frame::Num { at, .. } => match at {
            NumAt::Start | NumAt::Sign | NumAt::Dot | NumAt::Exp | NumAt::ExpSign => 1,
            _ => 0,
        },
        Frame::Lit { text, pos } => text.len() - pos,
        Frame::Enum { node, typed } => enum_options(s, *node)
            .iter()
            .filter(|o| o.starts_with(typed))
            .map(|o| o.len() - typed.len())
            .min()
            .unwrap_or(usize::MAX / 4),
        Frame::Arr { item, stage } => match stage {
            Stage::Comma => s.min_len[*item] + 1,
            _ => 1,
        },
        Frame::Obj { node, used, stage } => match node.map(|n| &s.nodes[n]) {
            Some(Node::Object { props, required }) => {
                object_min_close(s, props, required, used, stage)
            }
            // Any object: `"":0}` at most from any stage.
            _ => match stage {
                Stage::Open | Stage::Value => 1,
                Stage::Comma => 5,
                Stage::Key(_, lex) => lex.min_close() + 3,
                Stage::Colon(_) => 3,
            },
        },
    }
}

fn object_min_close(
    s: &Schema,
    props: &[(Vec<u8>, usize)],
    required: &[bool],
    used: &[bool],
    stage: &Stage,
) -> usize {
    let len = |i: usize| prop_len(&props[i].0, s.min_len[props[i].1]);
    let missing: Vec<usize> = (0..props.len())
        .filter(|&i| required[i] && !used[i])
        .collect();
    // The missing properties after a value: ",name:value" each, then '}'.
    let after = |skip: Option<usize>| -> usize {
        let rest = missing.iter().filter(|&&i| Some(i) != skip);
        rest.map(|&i| 1 + len(i)).sum::<usize>() + 1
    };
    // The missing properties from where a key may begin: the first without its comma.
    let from_key =
        missing.iter().map(|&i| len(i)).sum::<usize>() + missing.len().saturating_sub(1) + 1;
    const DEAD: usize = usize::MAX / 4;
    match stage {
        Stage::Open => {
            if missing.is_empty() {
                1
            } else {
                from_key
            }
        }
        Stage::Comma if missing.is_empty() => (0..props.len())
            .filter(|&i| !used[i])
            .map(|i| len(i) + 1)
            .min()
            .unwrap_or(DEAD),
        Stage::Comma => from_key,
        Stage::Value => after(None),
        Stage::Colon(i) => 1 + s.min_len[props[*i].1] + after(None),
        Stage::Key(typed, _) => (0..props.len())
            .filter(|&i| !used[i] && props[i].0.starts_with(typed))
            .map(|i| (props[i].0.len() - typed.len()) + 2 + s.min_len[props[i].1] + after(Some(i)))
            .min()
            .unwrap_or(DEAD),
    }
}

/// Each token's text as bytes (empty: the token is never allowed in a document: special
/// tokens, and pieces of a UTF-8 character that a pretrained tokenizer decodes to U+FFFD).
pub struct TokenBytes(Vec<Vec<u8>>);

impl TokenBytes {
    pub fn new(tok: &Tokenizer, vocab: usize) -> TokenBytes {
        let mut out = Vec::with_capacity(vocab);
        for id in 0..vocab as i64 {
            let mut bytes = Vec::new();
            match tok {
                Tokenizer::Text(t) => {
                    let text = u32::try_from(id)
                        .ok()
                        .and_then(|i| t.tokenizer.decode(&[i], true).ok())
                        .unwrap_or_default();
                    if !text.contains(char::REPLACEMENT_CHARACTER) && !tok.is_stop(id) {
                        bytes = text.into_bytes();
                    }
                }
                _ => {
                    if !tok.is_stop(id) {
                        tok.token_bytes(id, &mut bytes);
                    }
                }
            }
            out.push(bytes);
        }
        TokenBytes(out)
    }
    pub fn get(&self, id: usize) -> &[u8] {
        self.0.get(id).map_or(&[], Vec::as_slice)
    }
}

/// Candidates checked in the sampler's order before every token is checked.
const TRIES: usize = 16;

/// The next token under the constraint: one whose text continues the document and leaves it
/// closable within `left` more tokens (those after this one). The sampler picks as usual;
/// a refused pick is masked and the sampler asked again, up to `TRIES` times; then every
/// invalid token is masked at once. None: no token can continue the document.
pub fn pick(
    state: &mut JsonState,
    logits: &[f32],
    table: &TokenBytes,
    left: usize,
    sampling: &SamplingParams,
    rng: &mut Rng,
) -> Option<i64> {
    let try_token = |t: usize| -> Option<JsonState> {
        let bytes = table.get(t);
        if bytes.is_empty() {
            return None;
        }
        let mut next = state.clone();
        (next.feed(bytes) && next.min_close() <= left).then_some(next)
    };
    let mut masked = logits.to_vec();
    for _ in 0..TRIES {
        let t = sampling.sample(&masked, rng);
        if masked[t] == f32::NEG_INFINITY {
            break;
        }
        if let Some(next) = try_token(t) {
            *state = next;
            return Some(t as i64);
        }
        masked[t] = f32::NEG_INFINITY;
    }
    for (t, l) in masked.iter_mut().enumerate() {
        if *l != f32::NEG_INFINITY && try_token(t).is_none() {
            *l = f32::NEG_INFINITY;
        }
    }
    if masked.iter().all(|&l| l == f32::NEG_INFINITY) {
        return None;
    }
    let t = sampling.sample(&masked, rng);
    *state = try_token(t)?;
    Some(t as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Arc<Schema> {
        Arc::new(Schema::compile(&v).unwrap())
    }

    /// Whether `text` is a valid prefix (and whether it is then whole).
    fn check(s: &Arc<Schema>, text: &str) -> Option<bool> {
        let mut st = JsonState::new(s.clone());
        st.feed(text.as_bytes()).then(|| st.is_complete())
    }

    fn person() -> Arc<Schema> {
        schema(json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "score": {"type": "number"},
                "ok": {"type": "boolean"},
                "none": {"type": "null"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "color": {"enum": ["red", "green", 7]},
                "pet": {"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"]}
            },
            "required": ["name", "age"]
        }))
    }

    #[test]
    fn the_validator_accepts_prefixes_of_documents_of_the_schema() {
        let s = person();
        for (text, whole) in [
            ("", false),
            (" {", false),
            (r#"{"na"#, false),
            (r#"{"name":"Al\"\u00e9 é","age":-12"#, false),
            (r#"{"name":"x","age":3}"#, true),
            (r#"{ "age" : 0 , "name" : "" }"#, true),
            (
                r#"{"name":"x","age":3,"score":-0.5e+10,"ok":false,"none":null}"#,
                true,
            ),
            (
                r#"{"name":"x","age":3,"tags":["a", "b"],"color":"green"}"#,
                true,
            ),
            (
                r#"{"name":"x","age":3,"color":7,"pet":{"kind":"cat"}}"#,
                true,
            ),
            (r#"{"name":"x","age":3,"tags":[]}"#, true),
        ] {
            assert_eq!(check(&s, text), Some(whole), "{text}");
        }
    }

    #[test]
    fn the_validator_rejects_what_cannot_continue_a_document_of_the_schema() {
        let s = person();
        for text in [
            "[",
            "x",
            r#"{"nam"e"#,
            r#"{"nick""#,
            r#"{"name":1"#,
            r#"{"name":"x"}"#,
            r#"{"name":"x","name""#,
            r#"{"name":"x","age":1.5"#,
            r#"{"name":"x","age":01"#,
            r#"{"name":"x","age":-0"#,
            r#"{"name":"x","age":1234567890123456"#,
            r#"{"name":"x","age":1,"score":1e123"#,
            r#"{"name":"x","age":1,"score":1.}"#,
            r#"{"name":"x","age":1,"ok":tru "#,
            r#"{"name":"x","age":1,"tags":[1"#,
            r#"{"name":"x","age":1,"tags":["a",]"#,
            r#"{"name":"x","age":1,"color":"blue"#,
            r#"{"name":"x","age":1,"color":7 7"#,
            r#"{"name":"x","age":1,"pet":{}"#,
            r#"{"name":"x","age":1}}"#,
            r#"{"name":"x","age":1} "#,
            "{\"name\":\"a\nb",
            r#"{"name":"\x"#,
            r#"{"name":"\ud800"#,
            "{\"name\":\"\u{e9}\"}",
            "{          \"name\"",
        ] {
            assert_eq!(check(&s, text), None, "{text}");
        }
        // Bytes of a character must form valid UTF-8.
        let mut st = JsonState::new(s.clone());
        assert!(st.feed(b"{\"name\":\"\xc3\xa9"));
        let mut st = JsonState::new(s);
        assert!(!st.feed(b"{\"name\":\"\xc3\x28"));
        assert!(!JsonState::new(person()).feed(b"{\"name\":\"\xed\xa0\x80"));
    }

    #[test]
    fn json_object_takes_any_object() {
        let s = Arc::new(Schema::any_object());
        assert_eq!(
            check(&s, r#"{"a":[1,{"b":null}],"c":"d","e":true}"#),
            Some(true)
        );
        assert_eq!(check(&s, "{}"), Some(true));
        assert_eq!(check(&s, "[]"), None);
        assert_eq!(check(&s, r#"{"a":}"#), None);
        assert_eq!(check(&s, r#"{"a" 1"#), None);
    }

    /// min_close is exact: the state after any prefix closes in that many bytes along the
    /// shortest path, and no fewer bytes make it whole.
    #[test]
    fn min_close_counts_the_bytes_that_finish_the_document() {
        let s = person();
        for (text, close) in [
            ("", r#"{"name":"","age":0}"#.len()),
            ("{", r#""name":"","age":0}"#.len()),
            (r#"{"age":1"#, r#","name":""}"#.len()),
            (r#"{"name":"ab"#, r#"","age":0}"#.len()),
            (r#"{"na"#, r#"me":"","age":0}"#.len()),
            (r#"{"name":"a","age":-"#, "0}".len()),
            (r#"{"name":"a","age":1,"#, r#""score":0}"#.len()),
            (r#"{"name":"a","age":1,"tags":["#, "]}".len()),
            (r#"{"name":"a","age":1,"tags":["x","#, r#""""]}"#.len() - 1),
            (r#"{"name":"a","age":1,"pet":"#, r#"{"kind":""}}"#.len()),
            (r#"{"name":"a","age":1,"color":"g"#, r#"reen"}"#.len()),
            (r#"{"name":"a\u00"#, r#"00","age":0}"#.len()),
        ] {
            let mut st = JsonState::new(s.clone());
            assert!(st.feed(text.as_bytes()), "{text}");
            assert_eq!(st.min_close(), close, "{text}");
        }
    }

    #[test]
    fn schemas_outside_the_subset_are_refused_by_keyword() {
        for (v, words) in [
            (json!({"type": "string"}), "top level"),
            (
                json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}),
                "'pattern'",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}),
                "list of types",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "date"}}}),
                "'type' must be one of",
            ),
            (json!({"type": "object", "anyOf": []}), "'anyOf'"),
            (json!({"type": "object", "$ref": "#/x"}), "'$ref'"),
            (json!({"type": "object", "required": ["b"]}), "'required'"),
            (json!({"type": "object", "properties": []}), "'properties'"),
            (
                json!({"type": "object", "properties": {"a": {"enum": []}}}),
                "'enum'",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "integer", "enum": ["x"]}}}),
                "'enum'",
            ),
            (
                json!({"type": "object", "properties": {"a": 3}}),
                "must be a JSON object",
            ),
            (
                json!({"type": "object", "properties": {"a": {"minimum": 3}}}),
                "'minimum'",
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                "'additionalProperties'",
            ),
        ] {
            let e = Schema::compile(&v).unwrap_err();
            assert!(e.contains(words), "{v}: {e}");
        }
        assert!(Schema::compile(
            &json!({"type": "object", "title": "t", "additionalProperties": false})
        )
        .is_ok());
    }

    /// Whatever the logits, `pick` picks tokens that make a whole document of the schema
    /// within the budget (bytes as tokens, random logits, greedy and sampled).
    #[test]
    fn picked_tokens_always_make_a_whole_document_in_time() {
        let s = person();
        let table = TokenBytes::new(&Tokenizer::Bytes, 256);
        let mut rng = Rng::new(5);
        for (trial, max) in (0..40).zip([20usize, 30, 64, 200].iter().cycle()) {
            let sampling = SamplingParams {
                temperature: if trial % 2 == 0 { 0.0 } else { 1.5 },
                ..Default::default()
            };
            let mut st = JsonState::new(s.clone());
            let mut out = Vec::new();
            for n in 0..*max {
                let logits: Vec<f32> = (0..256).map(|_| rng.normal() as f32 * 3.0).collect();
                let t = pick(&mut st, &logits, &table, max - n - 1, &sampling, &mut rng)
                    .expect("a token fits");
                out.push(t as u8);
                if st.is_complete() {
                    break;
                }
            }
            assert!(st.is_complete(), "{}", String::from_utf8_lossy(&out));
            let v: Value = serde_json::from_slice(&out).unwrap();
            assert!(v["name"].is_string() && v["age"].is_i64(), "{v}");
        }
    }
}
