//! The validator's tests: each keyword family accepting and refusing, error paths, refused
//! schemas, and the recursion and work bounds.
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
    assert!(ok(&integer, json!(1.0)) && ok(&integer, json!(u64::MAX)) && ok(&integer, json!(-3)));
    assert!(!ok(&integer, json!(1.5)) && !ok(&integer, json!("1")));
    let number = compile(json!({"type": "number"}));
    assert!(ok(&number, json!(3)));
    assert_eq!(err(&number, json!(true)), "$: expected number, got boolean");
}

#[test]
fn enum_and_const_compare_numbers_by_value() {
    let schema = compile(json!({"enum": [1, "a", {"k": [2]}]}));
    assert!(ok(&schema, json!(1.0)) && ok(&schema, json!("a")) && ok(&schema, json!({"k": [2.0]})));
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
    let contains = compile(json!({"contains": {"const": "x"}, "minContains": 2, "maxContains": 3}));
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
    let bad = json!({"name": "a", "children": [{"name": "b", "children": [{"name": "c"}, {}]}]});
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
