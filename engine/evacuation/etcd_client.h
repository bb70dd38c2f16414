// A small client of etcd's v3 API through its JSON gateway (POST /v3/kv/...,
// keys and values base64): what the etcd store needs and nothing more. One
// request at a time per client; libcurl does the HTTP.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/evacuation/records.h"

namespace gpumigrate::evacuation {

// etcd's JSON carries keys and values as base64.
std::string Base64(const std::string& in);
Result<std::string> Unbase64(const std::string& in);

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0;
};

class EtcdClient {
 public:
  explicit EtcdClient(std::string endpoint, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  const std::string& endpoint() const { return endpoint_; }

  // The key, or every key under `key` as a prefix, in key order.
  Result<std::vector<KeyValue>> Get(const std::string& key, bool prefix = false);

  // A transaction: when every compare holds, the success ops run, else none.
  struct Txn {
    J compare = J::array(), success = J::array();
    void IfAbsent(const std::string& key);                     // never created (or deleted)
    void IfModRevision(const std::string& key, int64_t rev);    // unchanged since read (0: absent)
    void IfValue(const std::string& key, const std::string& value);
    void Put(const std::string& key, const std::string& value);
    void Delete(const std::string& key);
  };
  Result<bool> Commit(const Txn& txn);

 private:
  Result<J> Post(const std::string& path, const J& body);

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
};

}  // namespace gpumigrate::evacuation
