//! Just enough XML for the S3 answers we read: `ListBucketResult` (ListObjectsV2),
//! `InitiateMultipartUploadResult` and `Error`. These are flat documents of simple elements
//! without attributes on the children, CDATA or comments, so a scan for `<Tag>…</Tag>` plus
//! entity decoding is exact for them; anything unexpected is an error, never a silent guess.

/// The text between `<tag>` (or `<tag attr="…">`) and `</tag>`, for every such element in order,
/// still escaped. `<tag/>` yields `""`. Elements of the same name must not nest (none do in
/// S3 answers).
pub(crate) fn elements<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut found = Vec::new();
    let mut rest = xml;
    while let Some(at) = rest.find(&open) {
        let after_name = &rest[at + open.len()..];
        // `<Key` must not match `<KeyCount>`: the name ends at `>`, `/` or whitespace.
        match after_name.chars().next() {
            Some('>') | Some('/') => {}
            Some(c) if c.is_whitespace() => {}
            _ => {
                rest = after_name;
                continue;
            }
        }
        let Some(end_of_open) = after_name.find('>') else {
            break;
        };
        if after_name[..end_of_open].ends_with('/') {
            found.push("");
            rest = &after_name[end_of_open + 1..];
            continue;
        }
        let content = &after_name[end_of_open + 1..];
        let Some(end) = content.find(&close) else {
            break;
        };
        found.push(&content[..end]);
        rest = &content[end + close.len()..];
    }
    found
}

/// The first `<tag>`'s text, decoded.
pub(crate) fn first(xml: &str, tag: &str) -> Option<String> {
    elements(xml, tag)
        .first()
        .and_then(|text| unescape(text).ok())
}

/// Decodes the five predefined entities and numeric character references.
pub(crate) fn unescape(text: &str) -> Result<String, String> {
    if !text.contains('&') {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        let entity_and_more = &rest[at + 1..];
        let Some(semicolon) = entity_and_more.find(';') else {
            return Err(format!("unterminated entity in {text:?}"));
        };
        let entity = &entity_and_more[..semicolon];
        let decoded = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity
                    .strip_prefix("#x")
                    .or_else(|| entity.strip_prefix("#X"))
                {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(decimal) = entity.strip_prefix('#') {
                    decimal.parse().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("unknown entity &{entity}; in {text:?}"))?
            }
        };
        out.push(decoded);
        rest = &entity_and_more[semicolon + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Escapes text for an element body.
pub(crate) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Decodes `encoding-type=url` keys: `%XX` bytes, and `+` as a space (AWS writes spaces as `+`
/// there; a literal `+` is always `%2B`, so this is unambiguous). A `%` not followed by two hex
/// digits is an error: `percent-encoding` would keep it as text, which would name another key.
pub(crate) fn percent_decode(text: &str) -> Result<String, String> {
    let well_formed = text.split('%').skip(1).all(|after| {
        after
            .as_bytes()
            .get(..2)
            .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return Err(format!("bad percent escape in {text:?}"));
    }
    percent_encoding::percent_decode_str(&text.replace('+', " "))
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| format!("{text:?} decodes to invalid UTF-8"))
}

/// One page of a ListObjectsV2 answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ListPage {
    pub objects: Vec<(String, u64)>,
    /// `Some(token)` when more pages follow.
    pub next: Option<String>,
}

/// Parses a `ListBucketResult`. `url_encoded`: the request asked for `encoding-type=url`, so
/// keys are percent-encoded (which lets keys hold characters XML 1.0 cannot).
pub(crate) fn parse_list(xml: &str, url_encoded: bool) -> Result<ListPage, String> {
    if elements(xml, "ListBucketResult").is_empty() {
        return Err(format!(
            "not a ListBucketResult: {}",
            xml.chars().take(200).collect::<String>()
        ));
    }
    // Only decode keys as URL-encoded if the server says it did so.
    let encoded = url_encoded
        && first(xml, "EncodingType")
            .map(|kind| kind.eq_ignore_ascii_case("url"))
            .unwrap_or(false);
    let mut objects = Vec::new();
    for contents in elements(xml, "Contents") {
        let key = elements(contents, "Key")
            .first()
            .copied()
            .ok_or("a <Contents> without <Key>")?;
        let key = unescape(key)?;
        let key = if encoded { percent_decode(&key)? } else { key };
        let size = elements(contents, "Size")
            .first()
            .ok_or_else(|| format!("<Contents> of {key} without <Size>"))?
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("<Size> of {key} is not a number"))?;
        objects.push((key, size));
    }
    let truncated = first(xml, "IsTruncated").is_some_and(|value| value.trim() == "true");
    let next = if truncated {
        let token = first(xml, "NextContinuationToken")
            .filter(|token| !token.is_empty())
            .ok_or("the listing is truncated but has no NextContinuationToken")?;
        Some(token)
    } else {
        None
    };
    Ok(ListPage { objects, next })
}

/// `(Code, Message)` of an S3 `<Error>` document; empty strings when absent.
pub(crate) fn parse_error(xml: &str) -> (String, String) {
    (
        first(xml, "Code").unwrap_or_default(),
        first(xml, "Message").unwrap_or_default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST_PAGE: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>segments</Name><Prefix>seg/</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>
  <EncodingType>url</EncodingType>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>seg/a%20b</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified>
    <ETag>&quot;abc&quot;</ETag><Size>10</Size><StorageClass>STANDARD</StorageClass></Contents>
  <Contents><Key>seg/%C3%BC+x%2By</Key><Size>0</Size>
    <Owner><ID>o</ID><DisplayName>d</DisplayName></Owner></Contents>
  <Contents><Key>seg/q&amp;r</Key><Size>123456789012</Size></Contents>
  <NextContinuationToken>tok/en=</NextContinuationToken>
</ListBucketResult>"#;

    #[test]
    fn list_page() {
        let page = parse_list(LIST_PAGE, true).unwrap();
        assert_eq!(
            page.objects,
            vec![
                ("seg/a b".to_string(), 10),
                ("seg/ü x+y".to_string(), 0),
                ("seg/q&r".to_string(), 123_456_789_012),
            ]
        );
        assert_eq!(page.next.as_deref(), Some("tok/en="));
    }

    #[test]
    fn last_and_empty_pages() {
        let last = r#"<ListBucketResult><Name>b</Name><KeyCount>1</KeyCount>
            <IsTruncated>false</IsTruncated><Contents><Key>k&lt;1&gt;</Key><Size>5</Size></Contents>
            </ListBucketResult>"#;
        let page = parse_list(last, false).unwrap();
        assert_eq!(page.objects, vec![("k<1>".to_string(), 5)]);
        assert_eq!(page.next, None);
        // Asked for url encoding, but the server did not apply it: keys are taken verbatim.
        let page = parse_list(
            "<ListBucketResult><Contents><Key>a%20b</Key><Size>1</Size></Contents></ListBucketResult>",
            true,
        )
        .unwrap();
        assert_eq!(page.objects, vec![("a%20b".to_string(), 1)]);
        let empty = "<ListBucketResult xmlns=\"x\"><Name>b</Name><Prefix/><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>";
        assert_eq!(
            parse_list(empty, true).unwrap(),
            ListPage {
                objects: vec![],
                next: None
            }
        );
    }

    #[test]
    fn malformed_lists_are_errors() {
        assert!(parse_list("<Error><Code>X</Code></Error>", true).is_err());
        assert!(parse_list(
            "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
            false
        )
        .is_err());
        assert!(parse_list(
            "<ListBucketResult><Contents><Key>a</Key><Size>x</Size></Contents></ListBucketResult>",
            false
        )
        .is_err());
        assert!(parse_list(
            "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
            false
        )
        .is_err());
    }

    #[test]
    fn errors_and_upload_ids() {
        let error = r#"<?xml version="1.0" encoding="UTF-8"?>
<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match &apos;x&apos;</Message><Resource>/b/k</Resource></Error>"#;
        assert_eq!(
            parse_error(error),
            (
                "SignatureDoesNotMatch".to_string(),
                "The request signature we calculated does not match 'x'".to_string()
            )
        );
        assert_eq!(parse_error(""), (String::new(), String::new()));
        let initiate = "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>VXBsb2Fk&#x2B;SUQ</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(first(initiate, "UploadId").as_deref(), Some("VXBsb2Fk+SUQ"));
    }

    #[test]
    fn entities_and_escapes() {
        assert_eq!(unescape("a &amp; b &#65;&#x42;").unwrap(), "a & b AB");
        assert!(unescape("a &bogus; b").is_err());
        assert!(unescape("a & b").is_err());
        assert_eq!(escape("\"a\"<&>"), "\"a\"&lt;&amp;&gt;");
        assert_eq!(percent_decode("a%2Fb+c%25").unwrap(), "a/b c%");
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%ff").is_err());
        assert!(percent_decode("a%2").is_err());
        assert!(percent_decode("a%").is_err());
        assert!(percent_decode("%+1").is_err());
        assert_eq!(percent_decode("%e2%82%AC%2b").unwrap(), "€+");
        assert_eq!(percent_decode("").unwrap(), "");
        // A tag name that is a prefix of another is not confused with it.
        assert_eq!(
            elements("<KeyCount>2</KeyCount><Key>k</Key>", "Key"),
            vec!["k"]
        );
        assert_eq!(
            elements("<Prefix/><Prefix>p</Prefix>", "Prefix"),
            vec!["", "p"]
        );
    }
}
