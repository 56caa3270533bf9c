//! The doctor's URLs (`https://host:port/path`, `http://host:port`), read by [`http::Uri`].

#[derive(Debug, thiserror::Error)]
pub(crate) enum UrlError {
    #[error("{0:?} is not a {1}://host:port URL")]
    Shape(String, &'static str),
}

/// `(host, port, path)` of `scheme://host[:port][/path]`; IPv6 hosts in brackets (returned
/// without them). The port defaults to the scheme's.
pub(crate) fn split_url(
    url: &str,
    scheme: &'static str,
) -> Result<(String, u16, String), UrlError> {
    let bad = || UrlError::Shape(url.to_string(), scheme);
    let uri: http::Uri = url.parse().map_err(|_| bad())?;
    if uri.scheme_str() != Some(scheme) {
        return Err(bad());
    }
    let host = uri.host().ok_or_else(bad)?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad());
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    let port_given = authority
        .rsplit(']')
        .next()
        .is_some_and(|a| a.contains(':'));
    let port = match uri.port_u16() {
        Some(port) => port,
        // `Uri` reads `host:port` (a port that is no number) as having no port
        None if port_given => return Err(bad()),
        None if scheme == "https" => 443,
        None => 80,
    };
    // `Uri` has no way to tell `https://h` from `https://h/`: both read as path "/"
    let path = match uri.path_and_query().map(|p| p.as_str()) {
        Some("/") if !url.ends_with('/') => "",
        Some(path) => path,
        None => "",
    };
    Ok((host.to_string(), port, path.to_string()))
}
