//! Validates webhook event payloads against the JSON Schema an operator registers for an event type.
//!
//! A documented subset of draft 2020-12, written for this purpose. Whatever it does not
//! implement is refused when the schema is compiled, so no keyword is ever silently ignored
//! except annotations (`title`, `format`, ...), which 2020-12 itself does not enforce.
//!
//! - Any type: `type`, `enum`, `const` (numbers compare by value: `1 == 1.0`).
//! - Objects: `properties`, `patternProperties`, `additionalProperties`, `required`,
//!   `minProperties`, `maxProperties`, `propertyNames`, `dependentRequired`.
//! - Arrays: `prefixItems`, `items`, `minItems`, `maxItems`, `uniqueItems`, `contains`,
//!   `minContains`, `maxContains`.
//! - Strings: `minLength`, `maxLength` (in characters), `pattern` (regex-lite syntax, unanchored).
//! - Numbers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`.
//! - Applicators: `allOf`, `anyOf`, `oneOf`, `not`, `if`/`then`/`else`, and `$ref` to `#` or
//!   `#/$defs/<name>` (`$defs` and `$id` only at the root).

use std::cell::Cell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Number, Value};

/// The only `$schema` accepted.
pub const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";
/// Largest schema accepted, serialized compactly (a backstop: callers limit sizes too).
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Deepest subschema nesting accepted (the root is level 0).
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// Deepest chain of nested schema applications while validating: a `$ref` cycle stops here
/// with an `Invalid` instead of overflowing the stack.
pub const MAX_EVAL_DEPTH: usize = 128;
/// Schema applications one validation may make: `anyOf` over `$ref` can otherwise be exponential.
const MAX_STEPS: u32 = 1_000_000;
/// Patterns per schema, and each one's compiled size: regex-lite matches in time linear in
/// the text but proportional to the program, so both are bounded.
const MAX_PATTERNS: usize = 128;
const PATTERN_SIZE_LIMIT: usize = 64 * 1024;

const SUBSET: &str = "Hooklane validates a subset of JSON Schema 2020-12, see docs";
const TYPES: [&str; 7] = [
    "null", "boolean", "object", "array", "number", "string", "integer",
];
const NUMBER: u8 = 1 << 4;
const INTEGER: u8 = 1 << 6;

/// A schema checked once when it is registered; validation then cannot fail on the schema itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    value: Value,
    root: Node,
    /// The root's `$defs`, in order; `$ref`s point into it by index.
    defs: Vec<Node>,
}

/// A schema refused at registration, naming the JSON Pointer of the offending keyword.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pointer}: {message}")]
pub struct SchemaError {
    pub pointer: String,
    pub message: String,
}

/// Why an instance does not match its schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct Invalid {
    /// Where in the instance, rooted at `$`: `$.amount`, `$.items[2].sku`, `$["a b"]`.
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Bool(bool),
    Keywords(Box<Keywords>),
}

#[derive(Debug, Clone, PartialEq)]
enum Ref {
    Root,
    Def(usize),
}

/// A compiled regex; compared by source so `Schema` can be `PartialEq`.
#[derive(Debug, Clone)]
struct Pattern(regex_lite::Regex);

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
struct Keywords {
    types: Option<u8>,
    enum_values: Option<Vec<Value>>,
    const_value: Option<Value>,
    minimum: Option<Number>,
    maximum: Option<Number>,
    exclusive_minimum: Option<Number>,
    exclusive_maximum: Option<Number>,
    multiple_of: Option<Number>,
    min_length: Option<u64>,
    max_length: Option<u64>,
    pattern: Option<Pattern>,
    required: Vec<String>,
    properties: BTreeMap<String, Node>,
    pattern_properties: Vec<(Pattern, Node)>,
    additional_properties: Option<Node>,
    min_properties: Option<u64>,
    max_properties: Option<u64>,
    property_names: Option<Node>,
    dependent_required: Vec<(String, Vec<String>)>,
    prefix_items: Vec<Node>,
    items: Option<Node>,
    min_items: Option<u64>,
    max_items: Option<u64>,
    unique_items: bool,
    contains: Option<Node>,
    min_contains: Option<u64>,
    max_contains: Option<u64>,
    reference: Option<Ref>,
    all_of: Vec<Node>,
    any_of: Vec<Node>,
    one_of: Vec<Node>,
    not: Option<Node>,
    if_: Option<Node>,
    then: Option<Node>,
    else_: Option<Node>,
}

impl Schema {
    /// Refuses what this validator does not implement, or a malformed schema, naming the
    /// JSON Pointer of the offending keyword in the schema (e.g. "/properties/amount/pattern").
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        let size = serde_json::to_vec(schema).map_or(usize::MAX, |bytes| bytes.len());
        if size > MAX_SCHEMA_BYTES {
            let message =
                format!("the schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted");
            return Err(fault("", message));
        }
        // `$defs` first, so that a `$ref` anywhere can be resolved to an index as it is compiled.
        let defs_value = match schema.get("$defs") {
            None => None,
            Some(Value::Object(defs)) => Some(defs),
            Some(_) => return Err(fault("/$defs", "must be an object of schemas")),
        };
        let mut compiler = Compiler {
            names: defs_value
                .into_iter()
                .flat_map(|d| d.keys().cloned())
                .collect(),
            patterns: 0,
        };
        let mut defs = Vec::new();
        for (name, def) in defs_value.into_iter().flatten() {
            defs.push(compiler.node(def, &child("/$defs", name), 1)?);
        }
        let root = compiler.node(schema, "", 0)?;
        Ok(Schema {
            value: schema.clone(),
            root,
            defs,
        })
    }

    /// The first error found (in the schema's evaluation order), or Ok.
    pub fn validate(&self, instance: &Value) -> Result<(), Invalid> {
        let eval = Eval {
            schema: self,
            steps: Cell::new(0),
        };
        eval.check(&self.root, instance, &Path::Root, 0)
            .map_err(|fail| match fail {
                Fail::Invalid(e) | Fail::Abort(e) => e,
            })
    }

    /// The schema as registered.
    pub fn as_value(&self) -> &Value {
        &self.value
    }
}

fn fault(pointer: &str, message: impl Into<String>) -> SchemaError {
    SchemaError {
        pointer: pointer.to_owned(),
        message: message.into(),
    }
}

/// `pointer` extended by one reference token, escaped as RFC 6901 says.
fn child(pointer: &str, token: &str) -> String {
    format!("{pointer}/{}", token.replace('~', "~0").replace('/', "~1"))
}

fn refusal(keyword: &str) -> String {
    let hint = match keyword {
        "$dynamicRef" | "$dynamicAnchor" | "$recursiveRef" | "$recursiveAnchor" | "$anchor" => {
            "use `$ref` to `#/$defs/<name>`"
        }
        "unevaluatedProperties" => "use `additionalProperties`",
        "unevaluatedItems" => "use `items`",
        "dependentSchemas" => "use `dependentRequired` or `if`/`then`",
        "contentSchema" => "payload content is not decoded",
        "definitions" => "draft-07 keyword: use `$defs`",
        "dependencies" => "draft-07 keyword: use `dependentRequired`",
        "additionalItems" => "draft-07 keyword: use `prefixItems` and `items`",
        _ => return format!("unknown keyword `{keyword}`: {SUBSET}"),
    };
    format!("`{keyword}` is not supported ({hint}): {SUBSET}")
}

struct Compiler {
    /// The root's `$defs` names, in the order `Schema::defs` holds them.
    names: Vec<String>,
    patterns: usize,
}

impl Compiler {
    fn node(&mut self, value: &Value, at: &str, depth: usize) -> Result<Node, SchemaError> {
        let map = match value {
            Value::Bool(b) => return Ok(Node::Bool(*b)),
            Value::Object(map) => map,
            _ => return Err(fault(at, "a schema must be an object or a boolean")),
        };
        if depth > MAX_SCHEMA_DEPTH {
            let message =
                format!("schemas nested deeper than {MAX_SCHEMA_DEPTH} levels are refused");
            return Err(fault(at, message));
        }
        let mut k = Keywords::default();
        for (key, v) in map {
            let at = &child(at, key);
            let d = depth + 1;
            match key.as_str() {
                "type" => k.types = Some(types(v, at)?),
                "enum" => k.enum_values = Some(array(v, at)?.clone()),
                "const" => k.const_value = Some(v.clone()),
                "minimum" => k.minimum = Some(number(v, at)?),
                "maximum" => k.maximum = Some(number(v, at)?),
                "exclusiveMinimum" => k.exclusive_minimum = Some(number(v, at)?),
                "exclusiveMaximum" => k.exclusive_maximum = Some(number(v, at)?),
                "multipleOf" => {
                    let n = number(v, at)?;
                    if n.as_f64().is_none_or(|f| f <= 0.0) {
                        return Err(fault(at, "must be greater than 0"));
                    }
                    k.multiple_of = Some(n);
                }
                "minLength" => k.min_length = Some(count(v, at)?),
                "maxLength" => k.max_length = Some(count(v, at)?),
                "pattern" => k.pattern = Some(self.pattern(text(v, at)?, at)?),
                "required" => k.required = strings(v, at)?,
                "properties" => {
                    for (name, s) in object(v, at)? {
                        let node = self.node(s, &child(at, name), d)?;
                        k.properties.insert(name.clone(), node);
                    }
                }
                "patternProperties" => {
                    for (source, s) in object(v, at)? {
                        let at = &child(at, source);
                        k.pattern_properties
                            .push((self.pattern(source, at)?, self.node(s, at, d)?));
                    }
                }
                "additionalProperties" => k.additional_properties = Some(self.node(v, at, d)?),
                "minProperties" => k.min_properties = Some(count(v, at)?),
                "maxProperties" => k.max_properties = Some(count(v, at)?),
                "propertyNames" => k.property_names = Some(self.node(v, at, d)?),
                "dependentRequired" => {
                    for (name, list) in object(v, at)? {
                        let list = strings(list, &child(at, name))?;
                        k.dependent_required.push((name.clone(), list));
                    }
                }
                "prefixItems" => k.prefix_items = self.list(v, at, d)?,
                "items" if v.is_array() => {
                    return Err(fault(
                        at,
                        "an array here is draft-07 syntax: use `prefixItems`",
                    ));
                }
                "items" => k.items = Some(self.node(v, at, d)?),
                "minItems" => k.min_items = Some(count(v, at)?),
                "maxItems" => k.max_items = Some(count(v, at)?),
                "uniqueItems" => {
                    k.unique_items = v.as_bool().ok_or_else(|| fault(at, "must be a boolean"))?;
                }
                "contains" => k.contains = Some(self.node(v, at, d)?),
                "minContains" => k.min_contains = Some(count(v, at)?),
                "maxContains" => k.max_contains = Some(count(v, at)?),
                "allOf" => k.all_of = self.list(v, at, d)?,
                "anyOf" => k.any_of = self.list(v, at, d)?,
                "oneOf" => k.one_of = self.list(v, at, d)?,
                "not" => k.not = Some(self.node(v, at, d)?),
                "if" => k.if_ = Some(self.node(v, at, d)?),
                "then" => k.then = Some(self.node(v, at, d)?),
                "else" => k.else_ = Some(self.node(v, at, d)?),
                "$ref" => k.reference = Some(self.reference(v, at)?),
                // Compiled by `Schema::compile`. Below the root, `$defs` and `$id` would open
                // new resources that `#/$defs/…` could not reach, or would mean something else.
                "$defs" | "$id" if depth == 0 => {}
                "$defs" | "$id" => {
                    return Err(fault(
                        at,
                        format!("`{key}` is only supported at the schema's root"),
                    ));
                }
                "$schema" if v.as_str() == Some(DIALECT) => {}
                "$schema" => {
                    return Err(fault(
                        at,
                        format!("must be \"{DIALECT}\": only 2020-12 is supported"),
                    ));
                }
                "$comment" | "title" | "description" | "default" | "examples" | "deprecated"
                | "readOnly" | "writeOnly" | "format" | "contentMediaType" | "contentEncoding" => {}
                other => return Err(fault(at, refusal(other))),
            }
        }
        Ok(Node::Keywords(Box::new(k)))
    }

    fn list(&mut self, v: &Value, at: &str, depth: usize) -> Result<Vec<Node>, SchemaError> {
        let items = array(v, at)?;
        if items.is_empty() {
            return Err(fault(at, "must be a non-empty array of schemas"));
        }
        let mut nodes = Vec::with_capacity(items.len());
        for (i, s) in items.iter().enumerate() {
            nodes.push(self.node(s, &format!("{at}/{i}"), depth)?);
        }
        Ok(nodes)
    }

    fn pattern(&mut self, source: &str, at: &str) -> Result<Pattern, SchemaError> {
        self.patterns += 1;
        if self.patterns > MAX_PATTERNS {
            return Err(fault(
                at,
                format!("a schema may have at most {MAX_PATTERNS} patterns"),
            ));
        }
        regex_lite::RegexBuilder::new(source)
            .size_limit(PATTERN_SIZE_LIMIT)
            .build()
            .map(Pattern)
            .map_err(|e| fault(at, format!("not a pattern this validator supports: {e}")))
    }

    fn reference(&self, v: &Value, at: &str) -> Result<Ref, SchemaError> {
        let target = text(v, at)?;
        if target == "#" {
            return Ok(Ref::Root);
        }
        let Some(escaped) = target.strip_prefix("#/$defs/").filter(|n| !n.contains('/')) else {
            let message =
                format!("`{target}`: only `#` and `#/$defs/<name>` references are supported");
            return Err(fault(at, message));
        };
        let name = escaped.replace("~1", "/").replace("~0", "~");
        let index = self.names.iter().position(|n| *n == name);
        index
            .map(Ref::Def)
            .ok_or_else(|| fault(at, format!("no `$defs` entry named `{name}`")))
    }
}

fn array<'v>(v: &'v Value, at: &str) -> Result<&'v Vec<Value>, SchemaError> {
    v.as_array().ok_or_else(|| fault(at, "must be an array"))
}

fn object<'v>(v: &'v Value, at: &str) -> Result<&'v serde_json::Map<String, Value>, SchemaError> {
    v.as_object().ok_or_else(|| fault(at, "must be an object"))
}

fn text<'v>(v: &'v Value, at: &str) -> Result<&'v str, SchemaError> {
    v.as_str().ok_or_else(|| fault(at, "must be a string"))
}

fn number(v: &Value, at: &str) -> Result<Number, SchemaError> {
    match v {
        Value::Number(n) => Ok(n.clone()),
        _ => Err(fault(at, "must be a number")),
    }
}

/// A non-negative integer; 2020-12 lets it be written `2.0`.
fn count(v: &Value, at: &str) -> Result<u64, SchemaError> {
    let integral = |f: &f64| f.fract() == 0.0 && (0.0..1.8e19).contains(f);
    let n = v
        .as_u64()
        .or_else(|| v.as_f64().filter(integral).map(|f| f as u64));
    n.ok_or_else(|| fault(at, "must be a non-negative integer"))
}

fn strings(v: &Value, at: &str) -> Result<Vec<String>, SchemaError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, item) in array(v, at)?.iter().enumerate() {
        let at = &format!("{at}/{i}");
        let s = text(item, at)?;
        if !seen.insert(s) {
            return Err(fault(at, format!("`{s}` is listed twice")));
        }
        out.push(s.to_owned());
    }
    Ok(out)
}

/// `type` as a bit set over `TYPES`.
fn types(v: &Value, at: &str) -> Result<u8, SchemaError> {
    let one = |t: &Value, at: &str| {
        let name = text(t, at)?;
        let i = TYPES.iter().position(|known| *known == name);
        let message = || {
            format!(
                "`{name}` is not a type (expected one of {})",
                TYPES.join(", ")
            )
        };
        i.map(|i| 1u8 << i).ok_or_else(|| fault(at, message()))
    };
    let Value::Array(list) = v else {
        return one(v, at);
    };
    if list.is_empty() {
        return Err(fault(at, "must not be empty"));
    }
    let mut mask = 0;
    for (i, t) in list.iter().enumerate() {
        let at = &format!("{at}/{i}");
        let bit = one(t, at)?;
        if mask & bit != 0 {
            return Err(fault(at, "is listed twice"));
        }
        mask |= bit;
    }
    Ok(mask)
}

fn is_integer(n: &Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

/// The instance's type name; integral numbers are "integer", as 2020-12 says.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(n) if is_integer(n) => "integer",
        Value::Number(_) => "number",
    }
}

fn type_bit(name: &str) -> u8 {
    TYPES.iter().position(|t| *t == name).map_or(0, |i| 1 << i)
}

/// Numbers by value, exactly when both are integers (so u64 and i64 extremes compare right).
fn compare(a: &Number, b: &Number) -> Ordering {
    match (a.as_i64(), b.as_i64(), a.as_u64(), b.as_u64()) {
        (Some(x), Some(y), _, _) => x.cmp(&y),
        (_, _, Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None, _, Some(_)) => Ordering::Less,
        (None, Some(_), Some(_), _) => Ordering::Greater,
        _ => {
            let (x, y) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            x.partial_cmp(&y).unwrap_or(Ordering::Equal)
        }
    }
}

/// JSON equality where numbers compare by value (`1 == 1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => compare(x, y) == Ordering::Equal,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_eq(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, p)| y.get(k).is_some_and(|q| json_eq(p, q)))
        }
        _ => a == b,
    }
}

/// A string equal for values `json_eq` calls equal, so `uniqueItems` is a hash look-up, not O(n²).
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            let text = match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => i.to_string(),
                (_, Some(u)) => u.to_string(),
                _ if f.fract() == 0.0 && f.abs() < 1e38 => (f as i128).to_string(),
                _ => format!("{f:?}"),
            };
            out.push_str(&text);
        }
        Value::Array(items) => {
            out.push('[');
            for item in items {
                canonical(item, out);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (key, item) in entries {
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(item, out);
                out.push(',');
            }
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn is_multiple(x: &Number, m: &Number) -> bool {
    let int = |n: &Number| {
        n.as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
    };
    if let (Some(x), Some(m)) = (int(x), int(m)) {
        return x.checked_rem(m) == Some(0);
    }
    let (Some(x), Some(m)) = (x.as_f64(), m.as_f64()) else {
        return false;
    };
    let q = x / m;
    // Decimal multiples such as 0.01 are inexact in binary: allow rounding error, relative to q.
    q.is_finite() && (q - q.round()).abs() < 1e-9_f64.max(q.abs() * f64::EPSILON * 4.0)
}

/// A value in messages, cut short so a large `enum` or `const` cannot flood a response.
fn brief(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(80) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// Where the validator is in the instance, rendered only when an error is reported.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn render(&self) -> String {
        match self {
            Path::Root => "$".to_owned(),
            Path::Key(parent, key) => {
                let mut chars = key.chars();
                let ident = chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
                match ident {
                    true => format!("{}.{key}", parent.render()),
                    false => format!("{}[{}]", parent.render(), Value::String((*key).to_owned())),
                }
            }
            Path::Index(parent, i) => format!("{}[{i}]", parent.render()),
        }
    }
}

enum Fail {
    Invalid(Invalid),
    /// A bound was hit: passed up through `not`/`anyOf`, never read as "does not match".
    Abort(Invalid),
}

type Checked = Result<(), Fail>;

fn invalid(path: &Path, message: impl Into<String>) -> Checked {
    Err(Fail::Invalid(Invalid {
        path: path.render(),
        message: message.into(),
    }))
}

fn abort(path: &Path, message: &str) -> Checked {
    Err(Fail::Abort(Invalid {
        path: path.render(),
        message: message.to_owned(),
    }))
}

struct Eval<'s> {
    schema: &'s Schema,
    steps: Cell<u32>,
}

impl Eval<'_> {
    fn check(&self, node: &Node, v: &Value, path: &Path, depth: usize) -> Checked {
        self.steps.set(self.steps.get().saturating_add(1));
        if depth > MAX_EVAL_DEPTH {
            return abort(path, "schema nesting too deep");
        }
        if self.steps.get() > MAX_STEPS {
            return abort(path, "validation takes too many steps");
        }
        let k = match node {
            Node::Bool(true) => return Ok(()),
            Node::Bool(false) => return invalid(path, "no value is allowed here"),
            Node::Keywords(k) => k,
        };
        if let Some(mask) = k.types {
            let bit = type_bit(type_of(v));
            if mask & bit == 0 && !(bit == INTEGER && mask & NUMBER != 0) {
                let names: Vec<_> = (0..TYPES.len())
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| TYPES[i])
                    .collect();
                return invalid(
                    path,
                    format!("expected {}, got {}", names.join(" or "), type_of(v)),
                );
            }
        }
        if let Some(c) = &k.const_value {
            if !json_eq(c, v) {
                return invalid(path, format!("must be {}", brief(c)));
            }
        }
        if let Some(options) = &k.enum_values {
            if !options.iter().any(|o| json_eq(o, v)) {
                let mut shown: Vec<_> = options.iter().take(10).map(brief).collect();
                if options.len() > 10 {
                    shown.push("…".to_owned());
                }
                return invalid(path, format!("must be one of [{}]", shown.join(", ")));
            }
        }
        match v {
            Value::Number(n) => self.number(k, n, path)?,
            Value::String(s) => self.string(k, s, path)?,
            Value::Object(map) => self.object(k, map, path, depth)?,
            Value::Array(items) => self.array(k, items, path, depth)?,
            _ => {}
        }
        self.applicators(k, v, path, depth + 1)
    }

    /// Whether `v` matches; only a bound being hit is an error.
    fn matches(&self, node: &Node, v: &Value, path: &Path, depth: usize) -> Result<bool, Fail> {
        match self.check(node, v, path, depth) {
            Ok(()) => Ok(true),
            Err(Fail::Invalid(_)) => Ok(false),
            Err(abort) => Err(abort),
        }
    }

    fn number(&self, k: &Keywords, n: &Number, path: &Path) -> Checked {
        // (bound, the side it excludes, whether equal is excluded too, the message's words)
        let bounds = [
            (&k.minimum, Ordering::Less, false, "at least"),
            (&k.maximum, Ordering::Greater, false, "at most"),
            (&k.exclusive_minimum, Ordering::Less, true, "greater than"),
            (&k.exclusive_maximum, Ordering::Greater, true, "less than"),
        ];
        for (bound, outside, exclusive, words) in bounds {
            let Some(bound) = bound else { continue };
            let order = compare(n, bound);
            if order == outside || (exclusive && order == Ordering::Equal) {
                return invalid(path, format!("must be {words} {bound}"));
            }
        }
        match &k.multiple_of {
            Some(m) if !is_multiple(n, m) => invalid(path, format!("must be a multiple of {m}")),
            _ => Ok(()),
        }
    }

    fn string(&self, k: &Keywords, s: &str, path: &Path) -> Checked {
        if k.min_length.is_some() || k.max_length.is_some() {
            let len = s.chars().count() as u64;
            if let Some(min) = k.min_length.filter(|min| len < *min) {
                return invalid(path, format!("must be at least {min} characters long"));
            }
            if let Some(max) = k.max_length.filter(|max| len > *max) {
                return invalid(path, format!("must be at most {max} characters long"));
            }
        }
        match &k.pattern {
            Some(p) if !p.0.is_match(s) => invalid(path, format!("must match {}", p.0.as_str())),
            _ => Ok(()),
        }
    }

    fn object(
        &self,
        k: &Keywords,
        map: &serde_json::Map<String, Value>,
        path: &Path,
        depth: usize,
    ) -> Checked {
        if let Some(name) = k.required.iter().find(|name| !map.contains_key(*name)) {
            return invalid(path, format!("required property `{name}` is missing"));
        }
        let len = map.len() as u64;
        if let Some(min) = k.min_properties.filter(|min| len < *min) {
            return invalid(path, format!("must have at least {min} properties"));
        }
        if let Some(max) = k.max_properties.filter(|max| len > *max) {
            return invalid(path, format!("must have at most {max} properties"));
        }
        for (name, needs) in k
            .dependent_required
            .iter()
            .filter(|(name, _)| map.contains_key(name))
        {
            if let Some(missing) = needs.iter().find(|n| !map.contains_key(*n)) {
                return invalid(
                    path,
                    format!("property `{missing}` is required when `{name}` is present"),
                );
            }
        }
        for (key, value) in map {
            if let Some(names) = &k.property_names {
                match self.check(names, &Value::String(key.clone()), path, depth + 1) {
                    Err(Fail::Invalid(e)) => {
                        return invalid(
                            path,
                            format!("property name `{key}` is invalid: {}", e.message),
                        );
                    }
                    other => other?,
                }
            }
            let at = Path::Key(path, key);
            let mut known = false;
            if let Some(s) = k.properties.get(key) {
                known = true;
                self.check(s, value, &at, depth + 1)?;
            }
            for (_, s) in k
                .pattern_properties
                .iter()
                .filter(|(p, _)| p.0.is_match(key))
            {
                known = true;
                self.check(s, value, &at, depth + 1)?;
            }
            match &k.additional_properties {
                Some(Node::Bool(false)) if !known => {
                    return invalid(path, format!("additional property `{key}` is not allowed"));
                }
                Some(s) if !known => self.check(s, value, &at, depth + 1)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn array(&self, k: &Keywords, items: &[Value], path: &Path, depth: usize) -> Checked {
        let len = items.len() as u64;
        if let Some(min) = k.min_items.filter(|min| len < *min) {
            return invalid(path, format!("must contain at least {min} items"));
        }
        if let Some(max) = k.max_items.filter(|max| len > *max) {
            return invalid(path, format!("must contain at most {max} items"));
        }
        if k.unique_items {
            let mut seen = HashMap::new();
            for (i, item) in items.iter().enumerate() {
                let mut key = String::new();
                canonical(item, &mut key);
                if let Some(first) = seen.insert(key, i) {
                    return invalid(
                        path,
                        format!("must not contain duplicates (items {first} and {i} are equal)"),
                    );
                }
            }
        }
        for (i, item) in items.iter().enumerate() {
            let schema = k.prefix_items.get(i).or(k.items.as_ref());
            if let Some(s) = schema {
                self.check(s, item, &Path::Index(path, i), depth + 1)?;
            }
        }
        let Some(contains) = &k.contains else {
            return Ok(());
        };
        let mut found = 0;
        for (i, item) in items.iter().enumerate() {
            found += u64::from(self.matches(contains, item, &Path::Index(path, i), depth + 1)?);
        }
        let min = k.min_contains.unwrap_or(1);
        if found < min {
            return invalid(
                path,
                format!("must contain at least {min} items matching `contains` (found {found})"),
            );
        }
        match k.max_contains {
            Some(max) if found > max => invalid(
                path,
                format!("must contain at most {max} items matching `contains` (found {found})"),
            ),
            _ => Ok(()),
        }
    }

    fn applicators(&self, k: &Keywords, v: &Value, path: &Path, depth: usize) -> Checked {
        if let Some(r) = &k.reference {
            let target = match r {
                Ref::Root => Some(&self.schema.root),
                Ref::Def(i) => self.schema.defs.get(*i),
            };
            if let Some(target) = target {
                self.check(target, v, path, depth)?;
            }
        }
        for s in &k.all_of {
            self.check(s, v, path, depth)?;
        }
        if !k.any_of.is_empty() {
            let mut any = false;
            for s in &k.any_of {
                any = any || self.matches(s, v, path, depth)?;
            }
            if !any {
                return invalid(path, "must match at least one schema in `anyOf`");
            }
        }
        if !k.one_of.is_empty() {
            let mut matched = Vec::new();
            for (i, s) in k.one_of.iter().enumerate() {
                if matched.len() < 2 && self.matches(s, v, path, depth)? {
                    matched.push(i);
                }
            }
            let message = match matched.as_slice() {
                [_] => None,
                [] => Some("matches none".to_owned()),
                [a, b, ..] => Some(format!("matches {a} and {b}")),
            };
            if let Some(m) = message {
                return invalid(
                    path,
                    format!("must match exactly one schema in `oneOf`, {m}"),
                );
            }
        }
        if let Some(not) = &k.not {
            if self.matches(not, v, path, depth)? {
                return invalid(path, "must not match the schema in `not`");
            }
        }
        if let Some(condition) = &k.if_ {
            let branch = if self.matches(condition, v, path, depth)? {
                &k.then
            } else {
                &k.else_
            };
            if let Some(s) = branch {
                self.check(s, v, path, depth)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn compile(schema: Value) -> Schema {
        Schema::compile(&schema).unwrap()
    }

    fn ok(schema: &Schema, instance: Value) -> bool {
        schema.validate(&instance).is_ok()
    }

    /// The error as `path: message`.
    fn err(schema: &Schema, instance: Value) -> String {
        schema.validate(&instance).unwrap_err().to_string()
    }

    /// The refusal as `pointer: message`.
    fn refused(schema: Value) -> String {
        Schema::compile(&schema).unwrap_err().to_string()
    }

    #[test]
    fn a_realistic_invoice_schema_accepts_and_rejects_with_paths() {
        let schema = compile(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "invoice.paid",
            "type": "object",
            "required": ["id", "amount", "currency"],
            "properties": {
                "id": {"type": "string", "minLength": 1},
                "amount": {"type": "integer", "minimum": 0},
                "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
                "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}
            },
            "additionalProperties": false,
            "$defs": {"line": {
                "type": "object",
                "required": ["sku", "amount"],
                "properties": {"sku": {"type": "string"}, "amount": {"type": "integer", "minimum": 0}}
            }}
        }));
        let good = json!({"id": "in_1", "amount": 1200, "currency": "EUR",
            "lines": [{"sku": "a", "amount": 200}, {"sku": "b", "amount": 1000.0}]});
        assert_eq!(schema.validate(&good), Ok(()));
        let with = |pointer: &str, value: Value| {
            let mut bad = good.clone();
            *bad.pointer_mut(pointer).unwrap() = value;
            err(&schema, bad)
        };
        assert_eq!(
            with("/lines/1/amount", json!(-5)),
            "$.lines[1].amount: must be at least 0"
        );
        assert_eq!(
            with("/lines/0/sku", json!(7)),
            "$.lines[0].sku: expected string, got integer"
        );
        assert_eq!(
            with("/currency", json!("eur")),
            "$.currency: must match ^[A-Z]{3}$"
        );
        assert_eq!(
            with("/amount", json!(12.5)),
            "$.amount: expected integer, got number"
        );
        assert_eq!(
            with("/lines/1", json!({"sku": "b"})),
            "$.lines[1]: required property `amount` is missing"
        );
        let missing = json!({"id": "in_1", "amount": 1});
        assert_eq!(
            err(&schema, missing),
            "$: required property `currency` is missing"
        );
        let extra = json!({"id": "in_1", "amount": 1, "currency": "EUR", "note": "x"});
        assert_eq!(
            err(&schema, extra),
            "$: additional property `note` is not allowed"
        );
        assert_eq!(err(&schema, json!([])), "$: expected object, got array");
    }

    #[test]
    fn boolean_schemas() {
        assert!(ok(&compile(json!(true)), json!({"any": [1]})));
        assert_eq!(
            err(&compile(json!(false)), json!(null)),
            "$: no value is allowed here"
        );
        let schema = compile(json!({"properties": {"legacy": false}}));
        assert!(ok(&schema, json!({"other": 1})));
        assert_eq!(
            err(&schema, json!({"legacy": 1})),
            "$.legacy: no value is allowed here"
        );
    }

    #[test]
    fn types_and_integral_floats() {
        let string = compile(json!({"type": "string"}));
        assert!(ok(&string, json!("a")));
        assert_eq!(err(&string, json!(1)), "$: expected string, got integer");
        let nullable = compile(json!({"type": ["string", "null"]}));
        assert!(ok(&nullable, json!(null)));
        assert_eq!(
            err(&nullable, json!(1.5)),
            "$: expected null or string, got number"
        );
        let integer = compile(json!({"type": "integer"}));
        assert!(
            ok(&integer, json!(1.0)) && ok(&integer, json!(u64::MAX)) && ok(&integer, json!(-3))
        );
        assert!(!ok(&integer, json!(1.5)) && !ok(&integer, json!("1")));
        let number = compile(json!({"type": "number"}));
        assert!(ok(&number, json!(3)));
        assert_eq!(err(&number, json!(true)), "$: expected number, got boolean");
    }

    #[test]
    fn enum_and_const_compare_numbers_by_value() {
        let schema = compile(json!({"enum": [1, "a", {"k": [2]}]}));
        assert!(
            ok(&schema, json!(1.0)) && ok(&schema, json!("a")) && ok(&schema, json!({"k": [2.0]}))
        );
        assert_eq!(
            err(&schema, json!(2)),
            r#"$: must be one of [1, "a", {"k":[2]}]"#
        );
        assert!(!ok(&schema, json!({"k": [2], "j": 1})));
        let currency = compile(json!({"enum": ["usd", "eur"]}));
        assert_eq!(
            err(&currency, json!("gbp")),
            r#"$: must be one of ["usd", "eur"]"#
        );
        let constant = compile(json!({"const": {"v": 10}}));
        assert!(ok(&constant, json!({"v": 10.0})));
        assert_eq!(err(&constant, json!({"v": 11})), r#"$: must be {"v":10}"#);
    }

    #[test]
    fn object_keywords() {
        let schema = compile(json!({
            "properties": {"a": {"type": "integer"}},
            "patternProperties": {"^x-": {"type": "string"}},
            "additionalProperties": {"type": "boolean"},
            "minProperties": 1, "maxProperties": 3,
            "dependentRequired": {"card": ["cvc"]}
        }));
        assert!(ok(&schema, json!({"a": 1, "x-tag": "t", "flag": true})));
        assert_eq!(
            err(&schema, json!({"x-tag": 2})),
            r#"$["x-tag"]: expected string, got integer"#
        );
        assert_eq!(
            err(&schema, json!({"flag": "y"})),
            "$.flag: expected boolean, got string"
        );
        assert_eq!(
            err(&schema, json!({})),
            "$: must have at least 1 properties"
        );
        let four = json!({"p": true, "q": true, "r": true, "s": true});
        assert_eq!(err(&schema, four), "$: must have at most 3 properties");
        let card = "$: property `cvc` is required when `card` is present";
        assert_eq!(err(&schema, json!({"card": true})), card);
        assert!(ok(&schema, json!({"card": true, "cvc": false})));
        let names = compile(json!({"propertyNames": {"pattern": "^[a-z_]+$"}}));
        assert!(ok(&names, json!({"ok_name": 1})));
        let bad = "$: property name `Bad` is invalid: must match ^[a-z_]+$";
        assert_eq!(err(&names, json!({"Bad": 1})), bad);
    }

    #[test]
    fn array_keywords() {
        let tuple = compile(
            json!({"prefixItems": [{"type": "string"}], "items": {"type": "integer"},
            "minItems": 1, "maxItems": 3}),
        );
        assert!(ok(&tuple, json!(["a", 1, 2])));
        assert_eq!(
            err(&tuple, json!([1])),
            "$[0]: expected string, got integer"
        );
        assert_eq!(
            err(&tuple, json!(["a", 1, "b"])),
            "$[2]: expected integer, got string"
        );
        assert_eq!(err(&tuple, json!([])), "$: must contain at least 1 items");
        assert_eq!(
            err(&tuple, json!(["a", 1, 2, 3])),
            "$: must contain at most 3 items"
        );
        let unique = compile(json!({"uniqueItems": true}));
        assert!(ok(&unique, json!([1, "1", [1], {"a": 1}, {"a": 2}])));
        let dup = "$: must not contain duplicates (items 1 and 2 are equal)";
        assert_eq!(err(&unique, json!([0, 1, 1.0])), dup);
        assert!(!ok(
            &unique,
            json!([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}])
        ));
        let contains =
            compile(json!({"contains": {"const": "x"}, "minContains": 2, "maxContains": 3}));
        assert!(ok(&contains, json!(["x", 1, "x"])));
        let few = "$: must contain at least 2 items matching `contains` (found 1)";
        assert_eq!(err(&contains, json!(["x"])), few);
        let many = "$: must contain at most 3 items matching `contains` (found 4)";
        assert_eq!(err(&contains, json!(["x", "x", "x", "x"])), many);
        let any = compile(json!({"contains": {"type": "null"}}));
        assert!(!ok(&any, json!([1])) && ok(&any, json!([1, null])));
    }

    #[test]
    fn string_keywords_count_chars_and_search_unanchored() {
        let schema = compile(json!({"minLength": 2, "maxLength": 3, "pattern": "\\d+"}));
        assert!(ok(&schema, json!("é9")) && ok(&schema, json!("ab1")));
        assert_eq!(
            err(&schema, json!("1")),
            "$: must be at least 2 characters long"
        );
        assert_eq!(
            err(&schema, json!("1234")),
            "$: must be at most 3 characters long"
        );
        assert_eq!(err(&schema, json!("abc")), "$: must match \\d+");
        assert!(ok(&schema, json!(5)), "string keywords ignore other types");
    }

    #[test]
    fn number_keywords() {
        let range = compile(json!({"minimum": 1, "maximum": 10}));
        assert!(ok(&range, json!(1)) && ok(&range, json!(10.0)));
        assert_eq!(err(&range, json!(0.5)), "$: must be at least 1");
        assert_eq!(err(&range, json!(11)), "$: must be at most 10");
        let open = compile(json!({"exclusiveMinimum": 0, "exclusiveMaximum": 5}));
        assert_eq!(err(&open, json!(0)), "$: must be greater than 0");
        assert_eq!(err(&open, json!(5.0)), "$: must be less than 5");
        assert!(ok(&open, json!(4.99)) && ok(&open, json!(0.001)));
        let huge = compile(json!({"maximum": i64::MAX}));
        assert!(
            !ok(&huge, json!(u64::MAX)) && ok(&huge, json!(i64::MIN)) && ok(&huge, json!(i64::MAX))
        );
        let cents = compile(json!({"multipleOf": 0.01}));
        for fine in [
            json!(19.99),
            json!(0.07),
            json!(12345678.91),
            json!(3),
            json!(-0.3),
        ] {
            assert!(ok(&cents, fine.clone()), "{fine}");
        }
        assert_eq!(err(&cents, json!(0.015)), "$: must be a multiple of 0.01");
        let fives = compile(json!({"multipleOf": 5}));
        assert!(ok(&fives, json!(-15)) && ok(&fives, json!(10.0)));
        assert!(!ok(&fives, json!(7)) && !ok(&fives, json!(7.5)));
    }

    #[test]
    fn combinators() {
        let all = compile(json!({"allOf": [{"type": "integer"}, {"minimum": 3}]}));
        assert!(ok(&all, json!(3)));
        assert_eq!(err(&all, json!(2)), "$: must be at least 3");
        let any = compile(json!({"anyOf": [{"type": "string"}, {"minimum": 3}]}));
        assert!(ok(&any, json!("s")) && ok(&any, json!(4)));
        assert_eq!(
            err(&any, json!(1)),
            "$: must match at least one schema in `anyOf`"
        );
        let one = compile(json!({"oneOf": [{"type": "integer"}, {"minimum": 3}]}));
        assert!(ok(&one, json!(2)) && ok(&one, json!(3.5)));
        assert_eq!(
            err(&one, json!(4)),
            "$: must match exactly one schema in `oneOf`, matches 0 and 1"
        );
        assert_eq!(
            err(&one, json!(1.5)),
            "$: must match exactly one schema in `oneOf`, matches none"
        );
        let not = compile(json!({"not": {"type": "null"}}));
        assert!(ok(&not, json!(0)));
        assert_eq!(
            err(&not, json!(null)),
            "$: must not match the schema in `not`"
        );
        let branch = compile(json!({
            "if": {"properties": {"kind": {"const": "card"}}},
            "then": {"required": ["last4"]},
            "else": {"required": ["iban"]}
        }));
        assert!(ok(&branch, json!({"kind": "card", "last4": "4242"})));
        assert_eq!(
            err(&branch, json!({"kind": "card"})),
            "$: required property `last4` is missing"
        );
        assert_eq!(
            err(&branch, json!({"kind": "sepa"})),
            "$: required property `iban` is missing"
        );
    }

    #[test]
    fn refs_recurse_over_the_instance() {
        let tree = compile(json!({"type": "object", "required": ["name"],
            "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}));
        let bad =
            json!({"name": "a", "children": [{"name": "b", "children": [{"name": "c"}, {}]}]});
        let missing = "$.children[0].children[1]: required property `name` is missing";
        assert_eq!(err(&tree, bad), missing);
        // 40 levels deep: within the depth cap, and within a test thread's stack.
        let mut deep = json!({"name": "leaf"});
        for _ in 0..40 {
            deep = json!({"name": "n", "children": [deep]});
        }
        assert_eq!(tree.validate(&deep), Ok(()));
        let escaped = compile(json!({"$defs": {"a/b": {"type": "null"}}, "$ref": "#/$defs/a~1b"}));
        assert!(!ok(&escaped, json!(1)) && ok(&escaped, json!(null)));
    }

    #[test]
    fn ref_cycles_stop_at_the_depth_cap_and_never_read_as_no_match() {
        for schema in [
            json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            json!({"$defs": {"a": {"not": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}),
            json!({"anyOf": [{"$ref": "#"}, true]}),
        ] {
            assert_eq!(
                err(&compile(schema.clone()), json!(1)),
                "$: schema nesting too deep",
                "{schema}"
            );
        }
    }

    #[test]
    fn exponential_schemas_stop_at_the_step_budget() {
        // Each level evaluates the one below twice (the first branch fails only afterwards).
        let schema = compile(json!({
            "$defs": {"a": {"anyOf": [{"items": {"$ref": "#/$defs/a"}, "contains": false},
                                      {"items": {"$ref": "#/$defs/a"}}]}},
            "$ref": "#/$defs/a"
        }));
        let mut nested = json!([]);
        for _ in 0..30 {
            nested = json!([nested]);
        }
        let message = schema.validate(&nested).unwrap_err().message;
        assert_eq!(message, "validation takes too many steps");
        assert!(ok(&schema, json!([[[]], []])));
    }

    #[test]
    fn paths_quote_keys_that_are_not_identifiers() {
        let schema = compile(
            json!({"additionalProperties": {"items": {"properties": {"sku": {"type": "string"}}}}}),
        );
        let at = |key: &str| {
            let instance = json!({key: [{}, {}, {"sku": 1}]});
            schema.validate(&instance).unwrap_err().path
        };
        assert_eq!(at("items"), "$.items[2].sku");
        assert_eq!(at("_x1"), "$._x1[2].sku");
        assert_eq!(at("a b"), r#"$["a b"][2].sku"#);
        assert_eq!(at("1x"), r#"$["1x"][2].sku"#);
        assert_eq!(at("q\""), r#"$["q\""][2].sku"#);
    }

    #[test]
    fn unsupported_keywords_are_refused_with_their_pointer() {
        let lookbehind = refused(json!({"properties": {"amount": {"pattern": "(?<=a)b"}}}));
        assert!(
            lookbehind.starts_with("/properties/amount/pattern: not a pattern"),
            "{lookbehind}"
        );
        let unevaluated = refused(json!({"allOf": [{"unevaluatedProperties": false}]}));
        assert!(unevaluated.starts_with("/allOf/0/unevaluatedProperties: `unevaluatedProperties` is not supported (use `additionalProperties`)"), "{unevaluated}");
        let unknown = "/properties/a~1b/frobnicate: unknown keyword `frobnicate`: Hooklane validates a subset of JSON Schema 2020-12, see docs";
        assert_eq!(
            refused(json!({"properties": {"a/b": {"frobnicate": 1}}})),
            unknown
        );
        for keyword in [
            "$dynamicRef",
            "$dynamicAnchor",
            "$anchor",
            "$recursiveRef",
            "unevaluatedItems",
            "dependentSchemas",
            "contentSchema",
            "definitions",
        ] {
            let message = refused(json!({"items": {keyword: "x"}}));
            assert!(
                message.starts_with(&format!("/items/{keyword}: `{keyword}` is not supported")),
                "{message}"
            );
        }
        for reference in [
            "https://example.com/s.json",
            "#/definitions/a",
            "#/$defs/a/properties/b",
            "#a",
        ] {
            let message = refused(json!({"$defs": {"a": {}}, "$ref": reference}));
            assert!(message.starts_with("/$ref: "), "{message}");
        }
        let dangling = refused(json!({"$defs": {"a": {}}, "not": {"$ref": "#/$defs/b"}}));
        assert_eq!(dangling, "/not/$ref: no `$defs` entry named `b`");
        assert!(
            refused(json!({"$schema": "http://json-schema.org/draft-07/schema#"}))
                .starts_with("/$schema: ")
        );
        assert!(refused(json!({"$defs": {"a": {"$defs": {}}}})).starts_with("/$defs/a/$defs: "));
        assert!(refused(json!({"items": {"$id": "x"}})).starts_with("/items/$id: "));
    }

    #[test]
    fn annotations_are_accepted_and_ignored() {
        let schema = compile(json!({
            "$schema": DIALECT, "$id": "https://hooklane.example/s", "$comment": "c", "title": "t",
            "description": "d", "default": 1, "examples": [1], "deprecated": true, "readOnly": true,
            "writeOnly": false, "format": "email", "contentMediaType": "text/plain", "contentEncoding": "base64"
        }));
        assert!(ok(&schema, json!("not an email")));
    }

    #[test]
    fn malformed_values_are_refused() {
        let cases = [
            (json!({"minLength": -1}), "/minLength"),
            (json!({"maxItems": 1.5}), "/maxItems"),
            (json!({"type": "strnig"}), "/type"),
            (json!({"type": ["string", 3]}), "/type/1"),
            (json!({"type": ["string", "string"]}), "/type/1"),
            (json!({"type": []}), "/type"),
            (json!({"required": "a"}), "/required"),
            (json!({"required": ["a", "a"]}), "/required/1"),
            (json!({"multipleOf": 0}), "/multipleOf"),
            (json!({"multipleOf": -0.5}), "/multipleOf"),
            (json!({"minimum": "1"}), "/minimum"),
            (json!({"properties": []}), "/properties"),
            (json!({"properties": {"a": 3}}), "/properties/a"),
            (json!({"items": [{}]}), "/items"),
            (json!({"anyOf": []}), "/anyOf"),
            (json!({"enum": "a"}), "/enum"),
            (json!({"uniqueItems": 1}), "/uniqueItems"),
            (
                json!({"dependentRequired": {"a": [1]}}),
                "/dependentRequired/a/0",
            ),
            (
                json!({"patternProperties": {"(": {}}}),
                "/patternProperties/(",
            ),
            (json!({"$defs": []}), "/$defs"),
            (json!("string"), ""),
        ];
        for (schema, pointer) in cases {
            let e = Schema::compile(&schema).unwrap_err();
            assert_eq!(e.pointer, pointer, "{schema}: {}", e.message);
        }
        assert_eq!(refused(json!({"type": "strnig"})), "/type: `strnig` is not a type (expected one of null, boolean, object, array, number, string, integer)");
        assert_eq!(
            refused(json!({"minLength": -1})),
            "/minLength: must be a non-negative integer"
        );
        let written_as_float = compile(json!({"minLength": 2.0}));
        assert!(!ok(&written_as_float, json!("a")) && ok(&written_as_float, json!("ab")));
    }

    #[test]
    fn size_nesting_and_pattern_bounds() {
        let mut deep = json!({"type": "null"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            deep = json!({"not": deep});
        }
        assert!(Schema::compile(&deep).is_ok());
        let too_deep = Schema::compile(&json!({"not": deep})).unwrap_err();
        assert_eq!(
            too_deep.pointer,
            format!("/not{}", "/not".repeat(MAX_SCHEMA_DEPTH))
        );
        assert_eq!(
            Schema::compile(&json!({"enum": vec!["x".repeat(1000); 70]}))
                .unwrap_err()
                .pointer,
            ""
        );
        assert!(Schema::compile(&json!({"enum": vec!["x".repeat(1000); 60]})).is_ok());
        let patterns: serde_json::Map<_, _> = (0..=MAX_PATTERNS)
            .map(|i| (format!("^p{i}$"), json!(true)))
            .collect();
        assert!(refused(json!({"patternProperties": patterns})).contains("at most 128 patterns"));
        assert!(refused(json!({"pattern": "a{5000}"})).contains("size limit"));
        assert!(Schema::compile(&json!({"pattern": "^.{0,255}$"})).is_ok());
    }

    #[test]
    fn the_registered_schema_is_kept_and_compared() {
        let value = json!({"type": "object", "properties": {"a": {"pattern": "^a"}}});
        let schema = compile(value.clone());
        assert_eq!(schema.as_value(), &value);
        assert_eq!(schema, compile(value));
        assert_ne!(
            schema,
            compile(json!({"type": "object", "properties": {"a": {"pattern": "^b"}}}))
        );
        fn shareable<T: Send + Sync>(_: &T) {}
        shareable(&schema);
    }
}
