#pragma once
// ApiError: a request the server refuses, with the HTTP status and OpenAI's error fields
// (`{"error":{"message","type","param","code"}}`), thrown where the request is read and turned
// into the response by the server.

#include <string>

#include "core/common/error.h"

namespace tokenfab::api {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {},
           std::string type = "invalid_request_error", std::string code = {})
      : Error(message),
        status(status),
        param(std::move(param)),
        type(std::move(type)),
        code(std::move(code)) {}

  int status;
  std::string param;  // the request field at fault; empty: none
  std::string type;   // invalid_request_error, authentication_error, …
  std::string code;   // empty: null
};

}  // namespace tokenfab::api
