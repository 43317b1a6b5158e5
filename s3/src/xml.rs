//! The XML of the S3 answers we read — `ListBucketResult` (ListObjectsV2),
//! `InitiateMultipartUploadResult` and `Error` — on quick-xml's event reader. An answer is read
//! into a small tree of elements by local name (S3 declares its namespace on the root), with
//! entities, character references and CDATA resolved in their text. Malformed XML is an error,
//! never a guess.

use std::borrow::Cow;

use quick_xml::escape::resolve_predefined_entity;
use quick_xml::events::BytesRef;
use quick_xml::events::Event;
use quick_xml::Reader;

/// Escapes text for an element body: `<`, `>`, `&` (and `\r`, which XML would turn into `\n`);
/// quotes stay, as they are in the ETags we send back.
pub(crate) use quick_xml::escape::partial_escape as escape;

/// One element: its local name, its text (all its character data joined) and its children.
#[derive(Debug)]
struct Element {
    name: String,
    text: String,
    children: Vec<Element>,
}

impl Element {
    fn named(name: &str) -> Element {
        Element {
            name: name.to_string(),
            text: String::new(),
            children: Vec::new(),
        }
    }

    fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|child| child.name == name)
    }

    /// The first element named `name` in document order, this one included.
    fn find(&self, name: &str) -> Option<&Element> {
        if self.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|child| child.find(name))
    }
}

/// Reads a whole document into its root element.
fn parse(xml: &str) -> Result<Element, String> {
    let mut reader = Reader::from_str(xml);
    let mut open: Vec<Element> = Vec::new();
    let mut root = None;
    loop {
        let event = reader.read_event().map_err(|error| {
            format!("malformed XML at byte {}: {error}", reader.error_position())
        })?;
        let text = match event {
            Event::Start(start) => {
                open.push(Element::named(start.local_name().as_ref()));
                continue;
            }
            Event::Empty(start) => {
                let element = Element::named(start.local_name().as_ref());
                attach(&mut open, &mut root, element)?;
                continue;
            }
            Event::End(_) => {
                // The reader has checked that the end tag matches the open element.
                let element = open.pop().ok_or("an end tag without a start tag")?;
                attach(&mut open, &mut root, element)?;
                continue;
            }
            Event::Text(text) => text.xml10_content(),
            Event::CData(data) => data.xml10_content(),
            Event::GeneralRef(reference) => resolve(&reference)?,
            Event::Decl(_) | Event::PI(_) | Event::Comment(_) | Event::DocType(_) => continue,
            Event::Eof => break,
        };
        match open.last_mut() {
            Some(element) => element.text.push_str(&text),
            None if is_xml_whitespace(&text) => {}
            None => return Err(format!("text {text:?} outside the root element")),
        }
    }
    if let Some(unclosed) = open.last() {
        return Err(format!("<{}> is not closed", unclosed.name));
    }
    root.ok_or_else(|| "no root element".to_string())
}

/// Adds a closed element to its parent, or makes it the root.
fn attach(
    open: &mut [Element],
    root: &mut Option<Element>,
    element: Element,
) -> Result<(), String> {
    match open.last_mut() {
        Some(parent) => parent.children.push(element),
        None if root.is_none() => *root = Some(element),
        None => return Err(format!("a second root element <{}>", element.name)),
    }
    Ok(())
}

/// `&#…;` and the five predefined entities; S3 declares no others.
fn resolve(reference: &BytesRef<'_>) -> Result<Cow<'static, str>, String> {
    let name: &str = reference;
    if let Some(char) = reference
        .resolve_char_ref()
        .map_err(|error| format!("bad character reference &{name};: {error}"))?
    {
        return Ok(Cow::Owned(char.to_string()));
    }
    resolve_predefined_entity(name)
        .map(Cow::Borrowed)
        .ok_or_else(|| format!("unknown entity &{name};"))
}

fn is_xml_whitespace(text: &str) -> bool {
    text.bytes()
        .all(|byte| matches!(byte, b' ' | b'\t' | b'\r' | b'\n'))
}

/// The local name of the root element, read up to it only: a truncated answer still tells what
/// it is. (S3 may send whitespace before it for a long time to keep the connection open.)
pub(crate) fn root_name(xml: &str) -> Option<String> {
    let mut reader = Reader::from_str(xml);
    loop {
        match reader.read_event().ok()? {
            Event::Start(start) | Event::Empty(start) => {
                return Some(start.local_name().as_ref().to_string())
            }
            Event::Eof => return None,
            _ => {}
        }
    }
}

/// The text of the first element named `tag` in document order, if the document is well-formed.
pub(crate) fn first(xml: &str, tag: &str) -> Option<String> {
    parse(xml)
        .ok()?
        .find(tag)
        .map(|element| element.text.clone())
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
    let root = parse(xml)
        .and_then(|root| match root.name.as_str() {
            "ListBucketResult" => Ok(root),
            other => Err(format!("the root element is <{other}>")),
        })
        .map_err(|why| {
            format!(
                "not a ListBucketResult ({why}): {}",
                xml.chars().take(200).collect::<String>()
            )
        })?;
    let text = |name: &str| root.child(name).map(|element| element.text.trim());
    // Only decode keys as URL-encoded if the server says it did so.
    let encoded =
        url_encoded && text("EncodingType").is_some_and(|kind| kind.eq_ignore_ascii_case("url"));
    let mut objects = Vec::new();
    for contents in root
        .children
        .iter()
        .filter(|child| child.name == "Contents")
    {
        let key = &contents
            .child("Key")
            .ok_or("a <Contents> without <Key>")?
            .text;
        let key = if encoded {
            percent_decode(key)?
        } else {
            key.clone()
        };
        let size = contents
            .child("Size")
            .ok_or_else(|| format!("<Contents> of {key} without <Size>"))?
            .text
            .trim()
            .parse::<u64>()
            .map_err(|_| format!("<Size> of {key} is not a number"))?;
        objects.push((key, size));
    }
    let next = if text("IsTruncated") == Some("true") {
        let token = root
            .child("NextContinuationToken")
            .map(|element| element.text.clone())
            .filter(|token| !token.is_empty())
            .ok_or("the listing is truncated but has no NextContinuationToken")?;
        Some(token)
    } else {
        None
    };
    Ok(ListPage { objects, next })
}

/// `(Code, Message)` of an S3 `<Error>` document; empty strings when absent or not XML.
pub(crate) fn parse_error(xml: &str) -> (String, String) {
    let Ok(root) = parse(xml) else {
        return (String::new(), String::new());
    };
    let text = |name: &str| {
        root.find(name)
            .map(|element| element.text.clone())
            .unwrap_or_default()
    };
    (text("Code"), text("Message"))
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

    /// An `encoding-type=url` page as AWS writes it: the prefix and the keys percent-encoded,
    /// control characters and XML's special characters among them.
    #[test]
    fn url_encoded_list_with_special_characters() {
        let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>p%2F</Prefix><ContinuationToken>t0</ContinuationToken><KeyCount>4</KeyCount><MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType><IsTruncated>false</IsTruncated><Contents><Key>p/%0D%0A%09%01</Key><Size>1</Size></Contents><Contents><Key>p/%3C%26%3E%22%27</Key><Size>2</Size></Contents><Contents><Key>p/a+b%2Bc%25d</Key><Size>3</Size></Contents><Contents><Key>p/%F0%9F%A6%80%E2%82%AC</Key><Size>4</Size></Contents></ListBucketResult>"#;
        let page = parse_list(xml, true).unwrap();
        let keys: Vec<&str> = page.objects.iter().map(|(key, _)| key.as_str()).collect();
        assert_eq!(keys, ["p/\r\n\t\u{1}", "p/<&>\"'", "p/a b+c%d", "p/🦀€"]);
        assert_eq!(page.next, None);
        // Not asked for: the same page's keys are taken verbatim.
        let page = parse_list(xml, false).unwrap();
        assert_eq!(page.objects[2].0, "p/a+b%2Bc%25d");
        // A bad escape in a key is an error, not another key.
        let bad = xml.replace("%0D", "%0G");
        assert!(parse_list(&bad, true)
            .unwrap_err()
            .contains("bad percent escape"));
    }

    /// Without `encoding-type=url` keys come escaped as XML: entities, character references,
    /// CDATA, comments and a namespace prefix all read as a conforming parser reads them.
    #[test]
    fn xml_escaped_keys() {
        let xml = "<?xml version=\"1.0\"?><!-- a comment -->\n<s3:ListBucketResult xmlns:s3=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
            <s3:Contents><s3:Key>a&amp;b&lt;c&gt;d&quot;e&apos;f</s3:Key><s3:Size>1</s3:Size></s3:Contents>\
            <s3:Contents><s3:Key>&#13;&#x1F980;&#65;</s3:Key><s3:Size> 2 </s3:Size></s3:Contents>\
            <s3:Contents><s3:Key><![CDATA[x<&>]]>y<!-- c -->z</s3:Key><s3:Size>3</s3:Size></s3:Contents>\
            <s3:Contents><s3:Key> spaced </s3:Key><s3:Size>4</s3:Size></s3:Contents>\
            </s3:ListBucketResult>";
        let page = parse_list(xml, true).unwrap();
        assert_eq!(
            page.objects,
            vec![
                ("a&b<c>d\"e'f".to_string(), 1),
                ("\r🦀A".to_string(), 2),
                ("x<&>yz".to_string(), 3),
                (" spaced ".to_string(), 4),
            ]
        );
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
        // An empty key element is an empty key, not a missing one.
        let page = parse_list(
            "<ListBucketResult><Contents><Key/><Size>0</Size></Contents></ListBucketResult>",
            false,
        )
        .unwrap();
        assert_eq!(page.objects, vec![(String::new(), 0)]);
    }

    #[test]
    fn malformed_lists_are_errors() {
        let cases = [
            ("<Error><Code>X</Code></Error>", "the root element is <Error>"),
            ("", "no root element"),
            ("<html>Bad Gateway", "not closed"),
            ("Bad Gateway", "outside the root element"),
            (
                "<ListBucketResult><Contents><Size>1</Size></Contents></ListBucketResult>",
                "without <Key>",
            ),
            (
                "<ListBucketResult><Contents><Key>a</Key></Contents></ListBucketResult>",
                "without <Size>",
            ),
            (
                "<ListBucketResult><Contents><Key>a</Key><Size>x</Size></Contents></ListBucketResult>",
                "is not a number",
            ),
            (
                "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>",
                "no NextContinuationToken",
            ),
            (
                "<ListBucketResult><IsTruncated>true</IsTruncated><NextContinuationToken/></ListBucketResult>",
                "no NextContinuationToken",
            ),
            (
                "<ListBucketResult><Contents><Key>a</Key><Size>1</Size></Content></ListBucketResult>",
                "malformed XML",
            ),
            ("<ListBucketResult><Contents>", "not closed"),
            ("<ListBucketResult/><ListBucketResult/>", "second root"),
            (
                "<ListBucketResult><Contents><Key>a&bogus;</Key><Size>1</Size></Contents></ListBucketResult>",
                "unknown entity &bogus;",
            ),
            (
                "<ListBucketResult><Contents><Key>a & b</Key><Size>1</Size></Contents></ListBucketResult>",
                "malformed XML",
            ),
            (
                "<ListBucketResult><Contents><Key>&#0;</Key><Size>1</Size></Contents></ListBucketResult>",
                "bad character reference",
            ),
        ];
        for (xml, why) in cases {
            match parse_list(xml, false) {
                Err(message) => assert!(message.contains(why), "{xml}: {message}"),
                Ok(page) => panic!("{xml}: {page:?}"),
            }
        }
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
        assert_eq!(
            parse_error("<html><body>502 Bad Gateway</body>"),
            (String::new(), String::new())
        );
        assert_eq!(
            parse_error("<Error><Code>SlowDown</Code></Error>"),
            ("SlowDown".to_string(), String::new())
        );
        let initiate = "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key><UploadId>VXBsb2Fk&#x2B;SUQ</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(first(initiate, "UploadId").as_deref(), Some("VXBsb2Fk+SUQ"));
        assert_eq!(first(initiate, "Missing"), None);
        assert_eq!(first("<a><UploadId>", "UploadId"), None);
    }

    #[test]
    fn root_names() {
        let complete_error = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{}<Error><Code>InternalError</Code>",
            " \n".repeat(2000)
        );
        assert_eq!(root_name(&complete_error).as_deref(), Some("Error"));
        assert_eq!(
            root_name(&format!("{}<Error/>", "  ".repeat(300))).as_deref(),
            Some("Error")
        );
        assert_eq!(
            root_name(
                "<?xml version=\"1.0\"?><CompleteMultipartUploadResult xmlns=\"x\"><ETag>e</ETag>"
            )
            .as_deref(),
            Some("CompleteMultipartUploadResult")
        );
        // Whitespace or a byte-order mark before the declaration.
        for head in ["  \n", "\u{feff}"] {
            let xml = format!("{head}<?xml version=\"1.0\"?><Error><Code>C</Code></Error>");
            assert_eq!(root_name(&xml).as_deref(), Some("Error"));
            assert_eq!(parse_error(&xml).0, "C");
        }
        assert_eq!(root_name(""), None);
        assert_eq!(root_name("   "), None);
    }

    #[test]
    fn escapes() {
        assert_eq!(escape("\"a\"<&>"), "\"a\"&lt;&amp;&gt;");
        assert_eq!(escape("\"etag-1\""), "\"etag-1\"");
        assert_eq!(percent_decode("a%2Fb+c%25").unwrap(), "a/b c%");
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%ff").is_err());
        assert!(percent_decode("a%2").is_err());
        assert!(percent_decode("a%").is_err());
        assert!(percent_decode("%+1").is_err());
        assert_eq!(percent_decode("%e2%82%AC%2b").unwrap(), "€+");
        assert_eq!(percent_decode("").unwrap(), "");
    }
}
