// flashkv/flashkv.hpp — umbrella header for the C++ API.
#pragma once
#include "flashkv/attention.hpp"
#include "flashkv/diagnostics.hpp"
#include "flashkv/error.hpp"
#include "flashkv/types.hpp"
#if __has_include("flashkv/kvcache.hpp")
#include "flashkv/kvcache.hpp"
#endif
