//! A frontend's memory as the device sees it.

pub mod guest;
pub mod region;
