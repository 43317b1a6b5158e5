//! The dashboard: a page, a script and a stylesheet embedded in the binary (no build step),
//! served by the admin listener. The page polls the admin API (`/ready`, `/admin/cluster`,
//! `/admin/stats`, `/admin/streams`) and draws everything client side.

const INDEX_HTML: &str = include_str!("../../dashboard/index.html");
const APP_JS: &str = include_str!("../../dashboard/app.js");
const STYLE_CSS: &str = include_str!("../../dashboard/style.css");

/// Assets change with the binary, so they are revalidated rather than cached for long.
const CACHE: &str = "no-cache";

/// `(content type, body, cache-control)` of the dashboard asset at `path`, if any.
pub fn asset(path: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match path {
        "/" | "/index.html" | "/dashboard" => Some(("text/html; charset=utf-8", INDEX_HTML, CACHE)),
        "/assets/app.js" => Some(("text/javascript; charset=utf-8", APP_JS, CACHE)),
        "/assets/style.css" => Some(("text/css; charset=utf-8", STYLE_CSS, CACHE)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_links_the_embedded_assets() {
        let (kind, page, _) = asset("/").unwrap();
        assert!(kind.starts_with("text/html"));
        for linked in ["/assets/app.js", "/assets/style.css"] {
            assert!(page.contains(linked), "{linked} is linked");
            assert!(asset(linked).is_some(), "{linked} is served");
        }
        assert!(asset("/nope").is_none());
    }
}
