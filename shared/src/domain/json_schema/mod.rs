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
mod tests;
