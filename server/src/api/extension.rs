//! Extractors of what the authentication middleware puts on a request
//! (the admin's name, the scope), one shape for all of them.

/// An extractor of a value the authentication middleware
/// ([`super::auth`]) put on the request, answered with
/// `$missing` (an [`super::ApiError`]) when it is not there.
macro_rules! from_extension {
    ($ty:ty, $missing:expr) => {
        impl<S: Send + Sync> axum::extract::FromRequestParts<S> for $ty {
            type Rejection = $crate::api::ApiError;

            async fn from_request_parts(
                parts: &mut axum::http::request::Parts,
                _: &S,
            ) -> Result<Self, Self::Rejection> {
                parts
                    .extensions
                    .get::<$ty>()
                    .cloned()
                    .ok_or_else(|| $missing)
            }
        }
    };
}
pub(crate) use from_extension;
