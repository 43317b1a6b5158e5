//! Named consumers in the Pico protocol (`/?consumer=NAME`, docs/consumers.md): register one,
//! acquire it (or join its group as a member), acknowledge what was processed, release it.

use reqwest::Method;
use reqwest::Url;
use serde_json::{json, Value};

use crate::client::{Client, Protocol};
use crate::error::ClientError;
use crate::parse::send;

/// A consumer as the server answered it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerView {
    /// `REGISTERED` or `READING`.
    pub state: String,
    pub group: bool,
    pub epoch: u64,
    pub lease_ttl_ms: u64,
    /// Every stream of the consumer with where reading resumes.
    pub streams: Vec<ConsumerCursor>,
    /// The holder's token (answered by an acquire only).
    pub token: Option<String>,
    /// The streams this member holds (a group's acquire and acks).
    pub assignment: Option<Vec<ConsumerCursor>>,
}

/// One stream of a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerCursor {
    pub stream: String,
    /// The first record not yet acknowledged.
    pub next_seq: u64,
    /// Group: the member holding the stream.
    pub member: Option<String>,
}

impl Client {
    fn consumer_url(&self, name: &str, pairs: &[(&str, &str)]) -> Result<Url, ClientError> {
        if self.protocol() != Protocol::Pico {
            return Err(ClientError::Unsupported(
                "consumers are served here in the Pico protocol; use --protocol pico (Durable \
                 Streams clients use {root}__ds/consumers)"
                    .into(),
            ));
        }
        let mut url = self.stream_url("/")?;
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("consumer", name);
            for (key, value) in pairs {
                query.append_pair(key, value);
            }
        }
        Ok(url)
    }

    async fn consumer_call(
        &self,
        method: Method,
        url: Url,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Result<ConsumerView, ClientError> {
        let mut request = self.http().request(method, url);
        if let Some(token) = token {
            // Not `Authorization`: that carries the node's token, and HTTP clients other than
            // this one drop it on a redirect to another node (an ack of a stream another node
            // of a cluster serves).
            request = request.header("pico-consumer-token", token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = send(request).await?;
        let body = response.bytes().await?;
        parse_view(&body)
    }

    /// Registers consumer `name` over `streams` (again: the same registration is found).
    pub async fn consumer_register(
        &self,
        name: &str,
        streams: &[String],
        group: bool,
        lease_ttl_ms: Option<u64>,
    ) -> Result<ConsumerView, ClientError> {
        let mut body = json!({ "streams": streams, "group": group });
        if let Some(ttl) = lease_ttl_ms {
            body["lease_ttl_ms"] = json!(ttl);
        }
        let url = self.consumer_url(name, &[])?;
        self.consumer_call(Method::PUT, url, None, Some(body)).await
    }

    /// The consumer's state and offsets.
    pub async fn consumer(&self, name: &str) -> Result<ConsumerView, ClientError> {
        let url = self.consumer_url(name, &[])?;
        self.consumer_call(Method::GET, url, None, None).await
    }

    /// Acquires the consumer (a group: joins it as `member`); the answer carries the token.
    pub async fn consumer_acquire(
        &self,
        name: &str,
        member: Option<&str>,
    ) -> Result<ConsumerView, ClientError> {
        let mut pairs = vec![("action", "acquire")];
        if let Some(member) = member {
            pairs.push(("member", member));
        }
        let url = self.consumer_url(name, &pairs)?;
        self.consumer_call(Method::POST, url, None, None).await
    }

    /// Acknowledges `offsets` (stream, last record processed), all or none; none at all is a
    /// heartbeat that keeps the lease.
    pub async fn consumer_ack(
        &self,
        name: &str,
        token: &str,
        offsets: &[(String, u64)],
    ) -> Result<ConsumerView, ClientError> {
        let entries: Vec<Value> = offsets
            .iter()
            .map(|(stream, last)| json!({"stream": stream, "offset": last}))
            .collect();
        let url = self.consumer_url(name, &[("action", "ack")])?;
        self.consumer_call(
            Method::POST,
            url,
            Some(token),
            Some(json!({ "offsets": entries })),
        )
        .await
    }

    /// Releases the consumer (a group: leaves it); the offsets stay.
    pub async fn consumer_release(&self, name: &str, token: &str) -> Result<(), ClientError> {
        let url = self.consumer_url(name, &[("action", "release")])?;
        self.consumer_call(Method::POST, url, Some(token), None)
            .await
            .map(drop)
    }
}

fn parse_view(body: &[u8]) -> Result<ConsumerView, ClientError> {
    let bad = |why: &str| ClientError::InvalidResponse(format!("consumer answer: {why}"));
    let json: Value = serde_json::from_slice(body).map_err(|_| bad("not JSON"))?;
    let cursors = |value: &Value| -> Result<Vec<ConsumerCursor>, ClientError> {
        value
            .as_array()
            .ok_or_else(|| bad("streams is not an array"))?
            .iter()
            .map(|entry| {
                Ok(ConsumerCursor {
                    stream: entry["stream"]
                        .as_str()
                        .ok_or_else(|| bad("a stream without a name"))?
                        .to_string(),
                    next_seq: entry["next_seq"]
                        .as_u64()
                        .ok_or_else(|| bad("a stream without next_seq"))?,
                    member: entry["member"].as_str().map(str::to_string),
                })
            })
            .collect()
    };
    Ok(ConsumerView {
        state: json["state"].as_str().unwrap_or_default().to_string(),
        group: json["group"].as_bool().unwrap_or(false),
        epoch: json["epoch"].as_u64().unwrap_or(0),
        lease_ttl_ms: json["lease_ttl_ms"].as_u64().unwrap_or(0),
        streams: cursors(&json["streams"])?,
        token: json["token"].as_str().map(str::to_string),
        assignment: match &json["assignment"] {
            Value::Null => None,
            value => Some(cursors(value)?),
        },
    })
}
