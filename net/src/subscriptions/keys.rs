//! The node's secrets for subscriptions: the Ed25519 key that signs webhook deliveries (its
//! public half is served as a JWKS) and the HMAC key of callback tokens. A node without a state
//! file generates both at start and writes them there with its first subscription (see
//! `store`); from then on they are read back at every start, so the `kid` receivers cached and
//! the tokens already issued stay valid across restarts.

use crate::limits::TOKEN_BYTES_MAX;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{Ed25519KeyPair, KeyPair};
use ring::{digest, hmac};

/// Receivers reject signatures whose timestamp is further than this from their clock.
#[cfg(test)]
pub const SIGNATURE_TOLERANCE_SECS: u64 = 300;

/// Callback tokens expire this long after they were issued.
pub const TOKEN_TTL_SECS: u64 = 3600;

/// Bytes of the callback-token HMAC-SHA256 key.
pub const TOKEN_KEY_LEN: usize = 32;

/// Bytes that are not an Ed25519 PKCS#8 v2 key, with ring's reason.
#[derive(Debug)]
pub struct InvalidKey(pub ring::error::KeyRejected);

impl std::fmt::Display for InvalidKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not an Ed25519 PKCS#8 v2 key: {}", self.0)
    }
}

impl std::error::Error for InvalidKey {}

pub struct SigningKey {
    pair: Ed25519KeyPair,
    /// The PKCS#8 v2 document the pair was made from, for the state file.
    pkcs8: Vec<u8>,
    kid: String,
    jwks: String,
}

impl SigningKey {
    pub fn generate(rng: &SystemRandom) -> Result<SigningKey, ring::error::Unspecified> {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(rng)?;
        SigningKey::from_pkcs8(pkcs8.as_ref()).map_err(|_| ring::error::Unspecified)
    }

    /// The key of a PKCS#8 v2 document (as `pkcs8` returns it).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<SigningKey, InvalidKey> {
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8).map_err(InvalidKey)?;
        let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        // The RFC 7638 thumbprint (required members in lexicographic order, no spaces) names the
        // key; `ds_` marks it as a Durable Streams webhook key.
        let thumbprint = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
        let kid = format!(
            "ds_{}",
            URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, thumbprint.as_bytes()))
        );
        let jwks = serde_json::json!({
            "keys": [{"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "use": "sig", "alg": "EdDSA"}]
        })
        .to_string();
        Ok(SigningKey {
            pair,
            pkcs8: pkcs8.to_vec(),
            kid,
            jwks,
        })
    }

    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The body of `GET {root}__ds/jwks.json`.
    pub fn jwks_json(&self) -> &str {
        &self.jwks
    }

    #[cfg(test)]
    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// `Webhook-Signature: t=<unix>,kid=<kid>,ed25519=<base64url(sign("<t>.<body>"))>`; the
    /// timestamp is signed with the body so a captured delivery cannot be replayed later.
    pub fn signature_header(&self, body: &[u8], unix_secs: u64) -> String {
        let signature = self.pair.sign(&signed_message(unix_secs, body));
        format!(
            "t={unix_secs},kid={},ed25519={}",
            self.kid,
            URL_SAFE_NO_PAD.encode(signature.as_ref())
        )
    }
}

fn signed_message(unix_secs: u64, body: &[u8]) -> Vec<u8> {
    let mut message = format!("{unix_secs}.").into_bytes();
    message.extend_from_slice(body);
    message
}

/// What a receiver does with the header (the conformance suite's check), for tests.
#[cfg(test)]
pub fn verify_signature_header(
    header: &str,
    body: &[u8],
    kid: &str,
    public_key: &[u8],
    now_secs: u64,
) -> bool {
    let Some(rest) = header.strip_prefix("t=") else {
        return false;
    };
    let mut parts = rest.splitn(3, ',');
    let (Some(t), Some(k), Some(s)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let (Some(k), Some(s)) = (k.strip_prefix("kid="), s.strip_prefix("ed25519=")) else {
        return false;
    };
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) || k != kid {
        return false;
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return false;
    }
    let Ok(t_secs) = t.parse::<u64>() else {
        return false;
    };
    if t_secs.abs_diff(now_secs) > SIGNATURE_TOLERANCE_SECS {
        return false;
    }
    let Ok(sig) = URL_SAFE_NO_PAD.decode(s) else {
        return false;
    };
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public_key)
        .verify(&signed_message(t_secs, body), &sig)
        .is_ok()
}

/// Who a callback token was issued to: one wake generation of one subscription instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub subscription: String,
    /// Tells a deleted-and-recreated subscription of the same id from its predecessor.
    pub incarnation: u64,
    pub generation: u64,
    pub expires_unix: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenError {
    Invalid,
    Expired,
}

/// Callback tokens are `base64url(json claims).base64url(hmac)`: stateless, so a token of an
/// older generation still verifies and can be answered `FENCED` rather than `TOKEN_INVALID`.
pub struct TokenKey {
    key: hmac::Key,
    secret: [u8; TOKEN_KEY_LEN],
}

impl TokenKey {
    pub fn generate(rng: &SystemRandom) -> Result<TokenKey, ring::error::Unspecified> {
        let mut secret = [0u8; TOKEN_KEY_LEN];
        rng.fill(&mut secret)?;
        Ok(TokenKey::from_secret(secret))
    }

    pub fn from_secret(secret: [u8; TOKEN_KEY_LEN]) -> TokenKey {
        TokenKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            secret,
        }
    }

    /// The key bytes, for the state file.
    pub fn secret(&self) -> &[u8; TOKEN_KEY_LEN] {
        &self.secret
    }

    pub fn issue(&self, claims: &Claims) -> String {
        let payload = URL_SAFE_NO_PAD.encode(
            serde_json::json!({
                "sub": claims.subscription,
                "inc": claims.incarnation,
                "gen": claims.generation,
                "exp": claims.expires_unix,
            })
            .to_string(),
        );
        let tag = hmac::sign(&self.key, payload.as_bytes());
        format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    pub fn verify(&self, token: &str, now_secs: u64) -> Result<Claims, TokenError> {
        if token.len() > TOKEN_BYTES_MAX {
            return Err(TokenError::Invalid);
        }
        let (payload, tag) = token.split_once('.').ok_or(TokenError::Invalid)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::Invalid)?;
        hmac::verify(&self.key, payload.as_bytes(), &tag).map_err(|_| TokenError::Invalid)?;
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Invalid)?;
        let value: serde_json::Value =
            serde_json::from_slice(&json).map_err(|_| TokenError::Invalid)?;
        let claims = Claims {
            subscription: value["sub"]
                .as_str()
                .ok_or(TokenError::Invalid)?
                .to_string(),
            incarnation: value["inc"].as_u64().ok_or(TokenError::Invalid)?,
            generation: value["gen"].as_u64().ok_or(TokenError::Invalid)?,
            expires_unix: value["exp"].as_u64().ok_or(TokenError::Invalid)?,
        };
        if now_secs > claims.expires_unix {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwks_names_the_signing_key() {
        let key = SigningKey::generate(&SystemRandom::new()).unwrap();
        assert!(key.kid().starts_with("ds_"));
        let jwks: serde_json::Value = serde_json::from_str(key.jwks_json()).unwrap();
        let jwk = &jwks["keys"][0];
        assert_eq!(jwk["kty"], "OKP");
        assert_eq!(jwk["crv"], "Ed25519");
        assert_eq!(jwk["alg"], "EdDSA");
        assert_eq!(jwk["kid"], key.kid());
        let x = URL_SAFE_NO_PAD.decode(jwk["x"].as_str().unwrap()).unwrap();
        assert_eq!(x, key.public_key());
    }

    #[test]
    fn signature_header_verifies_and_binds_body_and_time() {
        let key = SigningKey::generate(&SystemRandom::new()).unwrap();
        let body = br#"{"subscription_id":"s"}"#;
        let header = key.signature_header(body, 1_700_000_000);
        assert!(header.starts_with(&format!("t=1700000000,kid={},ed25519=", key.kid())));
        let sig = header.rsplit_once("ed25519=").unwrap().1;
        assert!(sig
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        let (kid, pk) = (key.kid(), key.public_key());
        assert!(verify_signature_header(
            &header,
            body,
            kid,
            pk,
            1_700_000_100
        ));
        // Another body, a moved timestamp, a stale clock or another key all fail.
        assert!(!verify_signature_header(
            &header,
            b"{}",
            kid,
            pk,
            1_700_000_000
        ));
        let moved = header.replacen("t=1700000000", "t=1700000001", 1);
        assert!(!verify_signature_header(
            &moved,
            body,
            kid,
            pk,
            1_700_000_000
        ));
        assert!(!verify_signature_header(
            &header,
            body,
            kid,
            pk,
            1_700_001_000
        ));
        let other = SigningKey::generate(&SystemRandom::new()).unwrap();
        assert!(!verify_signature_header(
            &header,
            body,
            kid,
            other.public_key(),
            1_700_000_000
        ));
    }

    #[test]
    fn keys_rebuild_from_their_stored_bytes() {
        let rng = SystemRandom::new();
        let key = SigningKey::generate(&rng).unwrap();
        let again = SigningKey::from_pkcs8(key.pkcs8()).unwrap();
        assert_eq!(again.kid(), key.kid());
        assert_eq!(again.jwks_json(), key.jwks_json());
        let header = again.signature_header(b"{}", 1_700_000_000);
        assert!(verify_signature_header(
            &header,
            b"{}",
            key.kid(),
            key.public_key(),
            1_700_000_000
        ));
        assert!(SigningKey::from_pkcs8(b"not a key").is_err());
        let tokens = TokenKey::generate(&rng).unwrap();
        let claims = Claims {
            subscription: "s".into(),
            incarnation: 1,
            generation: 2,
            expires_unix: 1000,
        };
        let token = tokens.issue(&claims);
        let restored = TokenKey::from_secret(*tokens.secret());
        assert_eq!(restored.verify(&token, 999), Ok(claims));
    }

    #[test]
    fn tokens_round_trip_and_reject_tampering_and_expiry() {
        let rng = SystemRandom::new();
        let key = TokenKey::generate(&rng).unwrap();
        let claims = Claims {
            subscription: "sub.with.dots".into(),
            incarnation: 7,
            generation: 3,
            expires_unix: 1000,
        };
        let token = key.issue(&claims);
        assert_eq!(key.verify(&token, 999), Ok(claims.clone()));
        assert_eq!(key.verify(&token, 1001), Err(TokenError::Expired));
        let mut forged = token.clone();
        forged.insert(3, 'A');
        assert_eq!(key.verify(&forged, 999), Err(TokenError::Invalid));
        assert_eq!(key.verify("nodot", 999), Err(TokenError::Invalid));
        let other = TokenKey::generate(&rng).unwrap();
        assert_eq!(other.verify(&token, 999), Err(TokenError::Invalid));
    }
}
