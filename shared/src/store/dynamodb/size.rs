//! Item sizes by DynamoDB's published rules: attribute names and values (strings and
//! binaries by length, numbers about one byte per two significant digits plus one, booleans
//! and nulls one byte, lists and maps 3 bytes plus their elements).

use aws_sdk_dynamodb::types::AttributeValue;

use super::Item;

/// An item's size by DynamoDB's rules.
pub fn item_size(item: &Item) -> usize {
    item.iter()
        .map(|(name, value)| name.len() + value_size(value))
        .sum()
}

fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(set) => set.iter().map(String::len).sum(),
        AttributeValue::Ns(set) => set.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(set) => set.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(list) => 3 + list.iter().map(|v| value_size(v) + 1).sum::<usize>(),
        AttributeValue::M(map) => {
            3 + map
                .iter()
                .map(|(k, v)| k.len() + value_size(v) + 1)
                .sum::<usize>()
        }
        _ => 0,
    }
}

fn number_size(number: &str) -> usize {
    let digits: String = number
        .trim_start_matches('-')
        .split(['e', 'E'])
        .next()
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    significant.div_ceil(2) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_published_rules() {
        let s = |v: &str| AttributeValue::S(v.into());
        // "id" (2) + "abc" (3); "count" (5) + 12345 (3 digit pairs → 3 + 1).
        let item = Item::from([
            ("id".into(), s("abc")),
            ("count".into(), AttributeValue::N("12345".into())),
        ]);
        assert_eq!(item_size(&item), 5 + 5 + 4);
        assert_eq!(number_size("100"), 2);
        assert_eq!(number_size("-0.0012"), 2);
        let list = Item::from([("l".into(), AttributeValue::L(vec![s("ab"), s("c")]))]);
        assert_eq!(item_size(&list), 1 + 3 + (2 + 1) + (1 + 1));
    }
}
